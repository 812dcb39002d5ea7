#include "dplb/upstream/backend.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/url/parse.hpp>

namespace dplb::upstream {

topology::topology(std::size_t capacity)
    : capacity_(capacity),
      backends_(std::make_unique<backend[]>(capacity)),
      ranks_(std::make_unique<rank_entry[]>(capacity)) {}

const backend& topology::add(backend resolved, std::uint32_t weight, std::size_t cluster) {
  const std::size_t first_rank = rank_count_.load(std::memory_order_relaxed);
  const std::size_t index = backend_count_.load(std::memory_order_relaxed);
  if (resolved.dp == 0 || first_rank + resolved.dp > capacity_) {
    throw config::config_error("cannot add " + resolved.url + ": dplb serves at most " + std::to_string(capacity_) +
                               " ranks over its lifetime, and " + std::to_string(first_rank) +
                               " are taken (a removed backend keeps its ranks, to be added back under them)");
  }
  resolved.index = index;
  resolved.first_rank = first_rank;
  resolved.cluster = cluster;
  for (std::uint32_t k = 0; k < resolved.dp; ++k) {
    rank_entry& h = ranks_[first_rank + k];
    h.rank = first_rank + k;
    h.backend = index;
    h.rank_in_url = k;
    h.weight = weight;
    h.cluster = cluster;
    h.role = resolved.role;
    h.request_lines = resolved.host_line;
    h.name = resolved.url;
    if (resolved.dp > 1) {
      h.request_lines += "X-data-parallel-rank: " + std::to_string(k) + "\r\n";
      h.name += " #rank " + std::to_string(k);
    }
  }
  backends_[index] = std::move(resolved);
  rank_count_.store(first_rank + backends_[index].dp, std::memory_order_release);
  backend_count_.store(index + 1, std::memory_order_release);
  return backends_[index];
}

backend resolve_backend(const config::backend_spec& spec) {
  auto parsed = boost::urls::parse_uri(spec.url);
  if (!parsed) throw config::config_error("invalid backend URL '" + spec.url + "'");
  backend b;
  b.url = spec.url;
  b.dp = spec.dp;
  b.role = spec.role;
  b.kv_events = spec.kv_events;
  b.kv_replay = spec.kv_replay;
  b.host = std::string(parsed->host_address());
  // host_address() of "[::1]" is "::1"; the Host header keeps the brackets.
  b.authority = parsed->host_type() == boost::urls::host_type::ipv6 ? "[" + b.host + "]" : b.host;
  b.port = parsed->has_port() ? parsed->port_number() : 80;
  b.authority += ":" + std::to_string(b.port);
  b.host_line = "Host: " + b.authority + "\r\n";
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto results = resolver.resolve(b.host, std::to_string(b.port), ec);
  if (ec || results.empty()) {
    throw config::config_error("cannot resolve backend " + b.url + ": " + ec.message() +
                               "; check the host name or use an IP address");
  }
  for (const auto& entry : results) b.endpoints.push_back(entry.endpoint());
  return b;
}

void add_configured(topology& into, const std::vector<config::backend_spec>& specs) {
  for (const auto& spec : specs) into.add(resolve_backend(spec), spec.weight, spec.cluster);
}

}  // namespace dplb::upstream
