#pragma once
// A configured engine server (one DP rank): where it is and how to reach it. Immutable after start-up
// and shared read-only by every thread.

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace dplb::upstream {

struct backend {
  std::size_t rank = 0;    // index in --backend order
  std::string url;         // normalised "http://host:port", as shown in metrics and logs
  std::string host;        // as given (name or IP literal), without brackets
  std::uint16_t port = 80;
  std::string authority;   // "host:port", sent as the Host header upstream
  std::string host_line;   // "Host: host:port\r\n", as the engine's request carries it
  std::vector<boost::asio::ip::tcp::endpoint> endpoints;  // resolved once at start-up
};

// Parses each normalised URL from the settings and resolves its host. Throws config::config_error
// naming the backend when a host cannot be resolved (fatal at start-up, never on the request path).
std::vector<backend> resolve_backends(const std::vector<std::string>& urls);

}  // namespace dplb::upstream
