#include "dplb/upstream/backend.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/url/parse.hpp>

#include "dplb/config/settings.hpp"

namespace dplb::upstream {

std::vector<backend> resolve_backends(const std::vector<std::string>& urls) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  std::vector<backend> out;
  out.reserve(urls.size());
  for (std::size_t i = 0; i < urls.size(); ++i) {
    auto parsed = boost::urls::parse_uri(urls[i]);
    if (!parsed) throw config::config_error("invalid backend URL '" + urls[i] + "'");
    backend b;
    b.rank = i;
    b.url = urls[i];
    b.host = std::string(parsed->host_address());
    if (parsed->host_type() == boost::urls::host_type::ipv6) {
      // host_address() of "[::1]" is "::1"; the Host header keeps the brackets.
      b.authority = "[" + b.host + "]";
    } else {
      b.authority = b.host;
    }
    b.port = parsed->has_port() ? parsed->port_number() : 80;
    b.authority += ":" + std::to_string(b.port);
    b.host_line = "Host: " + b.authority + "\r\n";
    boost::system::error_code ec;
    auto results = resolver.resolve(b.host, std::to_string(b.port), ec);
    if (ec || results.empty()) {
      throw config::config_error("cannot resolve backend " + b.url + " (rank " + std::to_string(i) +
                                 "): " + ec.message() + "; check the host name or use an IP address");
    }
    for (const auto& entry : results) b.endpoints.push_back(entry.endpoint());
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace dplb::upstream
