#include "dplb/upstream/connection_pool.hpp"


namespace dplb::upstream {

namespace asio = boost::asio;

connection_pool::connection_pool(io::executor executor, const std::vector<backend>& backends,
                                 pool_limits limits)
    : executor_(executor), backends_(backends), limits_(limits), idle_(backends.size()),
      sweep_timer_(executor) {}

connection_ptr connection_pool::take_idle(std::size_t rank) {
  auto& idle = idle_[rank];
  const auto now = std::chrono::steady_clock::now();
  while (!idle.empty()) {
    connection_ptr c = std::move(idle.back());
    idle.pop_back();
    // LIFO: the freshest connection is the least likely to have been closed by the engine. An old
    // one is dropped here rather than raced against the engine's own keep-alive timeout.
    if (now - c->idle_since < limits_.idle_timeout) return c;
  }
  return nullptr;
}

io::task<connect_result> connection_pool::connect(std::size_t rank) {
  auto c = std::make_unique<upstream_connection>(executor_);
  c->stream.expires_after(limits_.connect_timeout);
  auto [ec, endpoint] = co_await c->stream.async_connect(backends_[rank].endpoints, io::as_result);
  if (ec) co_return connect_result{nullptr, ec};
  // Small requests and SSE events must leave at once, not wait for Nagle's algorithm.
  c->stream.socket().set_option(asio::ip::tcp::no_delay(true), ec);
  c->stream.expires_never();
  // Beast reads at most the buffer's free capacity (512 bytes when empty): room for a burst of SSE
  // events in one read instead of one system call per 512 bytes.
  c->buffer.reserve(4 * 1024);
  co_return connect_result{std::move(c), {}};
}

void connection_pool::give_back(std::size_t rank, connection_ptr connection) {
  if (stopped_ || !connection) return;
  auto& idle = idle_[rank];
  if (idle.size() >= limits_.max_idle_per_rank) return;  // closes it: the pool stays bounded
  connection->stream.expires_never();
  connection->idle_since = std::chrono::steady_clock::now();
  connection->reused = true;
  idle.push_back(std::move(connection));
}

void connection_pool::drop_expired(std::size_t rank, std::chrono::steady_clock::time_point now) {
  auto& idle = idle_[rank];
  // Oldest first: everything before the first young connection has expired.
  std::size_t keep_from = 0;
  while (keep_from < idle.size() && now - idle[keep_from]->idle_since >= limits_.idle_timeout) ++keep_from;
  idle.erase(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(keep_from));
}

io::task<void> connection_pool::sweep_loop() {
  // Without the sweep, a connection the engine closed would sit in CLOSE_WAIT until the next request
  // to that rank; the period is a quarter of the idle timeout so nothing lingers much beyond it.
  const auto period = std::max(limits_.idle_timeout / 4, std::chrono::milliseconds(50));
  while (!stopped_) {
    sweep_timer_.expires_after(period);
    auto [ec] = co_await sweep_timer_.async_wait(io::as_result);
    if (ec || stopped_) break;
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t rank = 0; rank < idle_.size(); ++rank) drop_expired(rank, now);
  }
}

void connection_pool::stop() {
  stopped_ = true;
  sweep_timer_.cancel();
  for (auto& idle : idle_) idle.clear();
}

}  // namespace dplb::upstream
