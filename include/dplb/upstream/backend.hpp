#pragma once
// Where the engines are. A backend is one engine server (one URL: one connection pool per worker, one
// health probe, one /metrics page); a rank is one DP engine, the unit the balancer picks. A plain backend
// is one rank; a `#dp=N` backend (vLLM's internal load balancing, N ranks behind one API server) is N
// ranks that share the backend's connections and tell the engine which rank they mean in
// X-data-parallel-rank.

#include <boost/asio/ip/tcp.hpp>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dplb/config/settings.hpp"

namespace dplb::upstream {

struct backend {
  std::size_t index = 0;   // in the order backends came (the command line's first)
  std::string url;         // normalised "http://host:port", as shown in metrics and logs
  std::string host;        // as given (name or IP literal), without brackets
  std::uint16_t port = 80;
  std::string authority;   // "host:port", sent as the Host header upstream
  std::string host_line;   // "Host: host:port\r\n", as dplb's own requests (health, metrics) carry it
  std::uint32_t dp = 1;    // DP ranks behind the URL
  std::size_t first_rank = 0;  // the global rank of its DP rank 0
  std::size_t cluster = 0;     // the cluster it serves
  config::rank_role role = config::rank_role::both;  // its cluster's: both, or prefill / decode
  std::vector<boost::asio::ip::tcp::endpoint> endpoints;  // resolved once, when it was added
  // Its engines' KV-cache event publishers and replay sockets (#kv-events=, #kv-replay=): rank j of the
  // backend on the port + j. ZMQ resolves their hosts itself, and reconnects.
  std::optional<config::zmq_endpoint> kv_events;
  std::optional<config::zmq_endpoint> kv_replay;
};

struct rank_entry {
  std::size_t rank = 0;          // global: the index in every per-rank table and the metrics' rank label
  std::size_t backend = 0;       // the index of its engine server
  std::uint32_t rank_in_url = 0;  // 0..dp-1 on its server: the X-data-parallel-rank it sends
  std::uint32_t weight = 1;      // as configured when it was added (the balancer holds the live one)
  std::size_t cluster = 0;
  config::rank_role role = config::rank_role::both;  // its backend's
  // The lines every request to this rank carries after its request line: the Host line, and for a rank
  // of a `#dp=N` backend its X-data-parallel-rank line (never for a plain backend: a one-rank server
  // under vLLM's external load balancing refuses any value but its own global rank, which dplb does not know).
  std::string request_lines;
  std::string name;  // for logs: the URL, and "#rank i" for a rank of a `#dp=N` backend
};

// Every backend and rank dplb has had since it started, in the order they came. Append-only: a rank
// number is a rank's identity for the life of the process (a removed rank keeps its entry, flagged
// removed in the balancer, and comes back under the same number if its URL is added again), and an
// entry never changes once added. So readers on any thread index it without a lock: add() fills the
// next slots of storage allocated once, then publishes the new counts (release); a reader's count
// (acquire) covers only complete entries. Ranks are published before their backend, so a backend a
// reader sees always has its ranks.
//
// Threading contract: readers on any thread; add() on one thread at a time (start-up, then the main
// thread's admin API and SIGHUP reload).
class topology {
 public:
  explicit topology(std::size_t capacity = config::max_ranks);

  std::span<const backend> backends() const noexcept {
    return {backends_.get(), backend_count_.load(std::memory_order_acquire)};
  }
  std::span<const rank_entry> ranks() const noexcept { return {ranks_.get(), rank_count_.load(std::memory_order_acquire)}; }
  std::size_t capacity() const noexcept { return capacity_; }

  // Appends a resolved backend (its index, first rank and cluster are set here) and its dp ranks, each
  // weighted `weight`. Throws config::config_error when the ranks would exceed the capacity.
  const backend& add(backend resolved, std::uint32_t weight, std::size_t cluster = 0);

 private:
  std::size_t capacity_;
  std::unique_ptr<backend[]> backends_;
  std::unique_ptr<rank_entry[]> ranks_;
  std::atomic<std::size_t> backend_count_{0};
  std::atomic<std::size_t> rank_count_{0};
};

// Parses a backend's normalised URL and resolves its host (blocking: at start-up, or on the main thread
// for the admin API and a reload). Throws config::config_error naming the backend when it cannot.
backend resolve_backend(const config::backend_spec& spec);

// Every configured backend, resolved and numbered in order.
void add_configured(topology& into, const std::vector<config::backend_spec>& specs);

}  // namespace dplb::upstream
