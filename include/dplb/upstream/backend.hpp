#pragma once
// Where the engines are. A backend is one engine server (one URL: one connection pool per worker, one
// health probe, one /metrics page); a host is one DP rank, the unit the balancer picks. A plain backend
// is one host; a `#dp=N` backend (vLLM's internal load balancing, N ranks behind one API server) is N
// hosts that share the backend's connections and tell the engine which rank they mean in
// X-data-parallel-rank. Immutable after start-up and shared read-only by every thread.

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "dplb/config/settings.hpp"

namespace dplb::upstream {

struct backend {
  std::size_t index = 0;   // in --backend order
  std::string url;         // normalised "http://host:port", as shown in metrics and logs
  std::string host;        // as given (name or IP literal), without brackets
  std::uint16_t port = 80;
  std::string authority;   // "host:port", sent as the Host header upstream
  std::string host_line;   // "Host: host:port\r\n", as dplb's own requests (health, metrics) carry it
  std::uint32_t dp = 1;    // DP ranks behind the URL
  std::size_t first_rank = 0;  // the global rank of its DP rank 0
  std::vector<boost::asio::ip::tcp::endpoint> endpoints;  // resolved once at start-up
};

struct host {
  std::size_t rank = 0;          // global: the index in every per-rank table and the metrics' rank label
  std::size_t backend = 0;       // the index of its engine server
  std::uint32_t rank_in_url = 0;  // 0..dp-1 on its server: the X-data-parallel-rank it sends
  std::uint32_t weight = 1;
  // The lines every request to this rank carries after its request line: the Host line, and for a rank
  // of a `#dp=N` backend its X-data-parallel-rank line (never for a plain backend: a one-rank server
  // under vLLM's external load balancing refuses any value but its own global rank, which dplb does not know).
  std::string request_lines;
  std::string name;  // for logs: the URL, and "#rank i" for a rank of a `#dp=N` backend
};

struct topology {
  std::vector<backend> backends;
  std::vector<host> hosts;  // hosts[r].rank == r
};

// Parses each backend's normalised URL from the settings, resolves its host and numbers the ranks.
// Throws config::config_error naming the backend when a host cannot be resolved (fatal at start-up,
// never on the request path).
topology resolve_topology(const std::vector<config::backend_spec>& specs);

}  // namespace dplb::upstream
