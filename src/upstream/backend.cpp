#include "dplb/upstream/backend.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/url/parse.hpp>

namespace dplb::upstream {

namespace {

backend resolve(const config::backend_spec& spec, std::size_t index, std::size_t first_rank,
                boost::asio::ip::tcp::resolver& resolver) {
  auto parsed = boost::urls::parse_uri(spec.url);
  if (!parsed) throw config::config_error("invalid backend URL '" + spec.url + "'");
  backend b;
  b.index = index;
  b.url = spec.url;
  b.dp = spec.dp;
  b.first_rank = first_rank;
  b.host = std::string(parsed->host_address());
  // host_address() of "[::1]" is "::1"; the Host header keeps the brackets.
  b.authority = parsed->host_type() == boost::urls::host_type::ipv6 ? "[" + b.host + "]" : b.host;
  b.port = parsed->has_port() ? parsed->port_number() : 80;
  b.authority += ":" + std::to_string(b.port);
  b.host_line = "Host: " + b.authority + "\r\n";
  boost::system::error_code ec;
  auto results = resolver.resolve(b.host, std::to_string(b.port), ec);
  if (ec || results.empty()) {
    throw config::config_error("cannot resolve backend " + b.url + " (rank " + std::to_string(first_rank) +
                               "): " + ec.message() + "; check the host name or use an IP address");
  }
  for (const auto& entry : results) b.endpoints.push_back(entry.endpoint());
  return b;
}

}  // namespace

topology resolve_topology(const std::vector<config::backend_spec>& specs) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  topology out;
  out.backends.reserve(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& b = out.backends.emplace_back(resolve(specs[i], i, out.hosts.size(), resolver));
    for (std::uint32_t k = 0; k < b.dp; ++k) {
      host h;
      h.rank = out.hosts.size();
      h.backend = i;
      h.rank_in_url = k;
      h.weight = specs[i].weight;
      h.request_lines = b.host_line;
      h.name = b.url;
      if (b.dp > 1) {
        h.request_lines += "X-data-parallel-rank: " + std::to_string(k) + "\r\n";
        h.name += " #rank " + std::to_string(k);
      }
      out.hosts.push_back(std::move(h));
    }
  }
  return out;
}

}  // namespace dplb::upstream
