#pragma once
// Reusable keep-alive connections to the engines, one pool per worker thread (never shared between
// threads, so it needs no locking), keyed by backend: the DP ranks behind one URL share its connections
// (the rank travels in each request's X-data-parallel-rank, not in the connection). A connection is
// either idle in the pool or owned by exactly one request; a request that cannot finish its response
// cleanly never gives its connection back.

#include <chrono>
#include <memory>
#include <vector>

#include "dplb/support/io_buffers.hpp"
#include "dplb/support/io_types.hpp"
#include "dplb/upstream/backend.hpp"

namespace dplb::upstream {

struct upstream_connection {
  explicit upstream_connection(const io::executor& ex) : stream(ex) {}
  upstream_connection(const upstream_connection&) = delete;
  upstream_connection& operator=(const upstream_connection&) = delete;

  io::tcp_stream stream;
  io::read_buffer buffer;  // bytes read from the engine beyond the last parsed message; no memory while empty in the pool
  std::chrono::steady_clock::time_point idle_since{};
  bool reused = false;  // true once it carried a response: the engine may have closed it since
};
using connection_ptr = std::unique_ptr<upstream_connection>;

struct pool_limits {
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::milliseconds idle_timeout{4'000};  // pooled connections older than this are closed
  std::size_t max_idle_per_rank = 256;  // a `#dp=N` backend keeps up to N times as many
};

// What connect() reports besides the connection, for metrics and error mapping.
struct connect_result {
  connection_ptr connection;      // null on failure
  boost::system::error_code error;
};

class connection_pool {
 public:
  // Backends added to the topology later get their idle list on first use.
  connection_pool(io::executor executor, const topology& topology, pool_limits limits);

  // The most recently used idle connection to the backend that is young enough and clean (the engine has
  // neither closed it nor sent anything on it while it waited), or null.
  connection_ptr take_idle(std::size_t backend);

  // Opens a new connection to the backend (trying each resolved endpoint), bounded by connect_timeout.
  io::task<connect_result> connect(std::size_t backend);

  // Returns a connection whose last response ended cleanly, that the engine keeps alive, and whose read
  // buffer is empty (its memory goes back to the thread's blocks while the connection waits here). Bytes the engine sends while it waits here answer no request, and an engine that
  // closes it would make the next request race the close: take_idle checks for either, and closes it.
  void give_back(std::size_t backend, connection_ptr connection);

  // Periodically closes idle connections that outlived idle_timeout; runs until stop().
  io::task<void> sweep_loop();
  void stop();

  std::size_t idle_count(std::size_t backend) const { return backend < idle_.size() ? idle_[backend].size() : 0; }

 private:
  void drop_expired(std::size_t backend, std::chrono::steady_clock::time_point now);
  std::vector<connection_ptr>& idle_list(std::size_t backend);

  io::executor executor_;
  const topology& topology_;
  pool_limits limits_;
  std::vector<std::vector<connection_ptr>> idle_;  // per backend; back() is the most recently used
  io::steady_timer sweep_timer_;
  bool stopped_ = false;
};

}  // namespace dplb::upstream
