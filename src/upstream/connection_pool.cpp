#include "dplb/upstream/connection_pool.hpp"

#include <boost/asio/buffer.hpp>
#include <utility>


namespace dplb::upstream {

namespace asio = boost::asio;

upstream_connection::~upstream_connection() {
  if (watch) watch->idle = nullptr;  // a watch completing after this must not touch the connection
}

namespace {

// One-byte MSG_PEEK receive on an idle connection: it costs nothing while the engine is silent, and
// completes when the engine closes the connection or sends bytes nobody asked for.
void watch_while_idle(upstream_connection& connection) {
  if (!connection.watch) connection.watch = std::make_shared<upstream_connection::idle_watch>();
  auto& watch = connection.watch;
  watch->idle = &connection;
  connection.stream.socket().async_receive(
      asio::buffer(&watch->probe, 1), io::socket::message_peek,
      [watch](const boost::system::error_code& ec, std::size_t) {
        // Aborted or cleared: taken for a request (take_idle cancels the watch) or destroyed.
        if (ec == asio::error::operation_aborted || !watch->idle) return;
        auto* connection = std::exchange(watch->idle, nullptr);
        connection->broken = true;
        boost::system::error_code ignored;
        connection->stream.socket().close(ignored);  // the engine sees the close now, not at the sweep
      });
}

}  // namespace

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
    if (c->broken || now - c->idle_since >= limits_.idle_timeout) continue;
    c->watch->idle = nullptr;  // the cancelled watch's handler, still to run, leaves the connection alone
    boost::system::error_code ignored;
    c->stream.socket().cancel(ignored);
    return c;
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
  // The request is written directly when the kernel takes it, without the event loop (the session's
  // write_now); asynchronous operations are unaffected.
  c->stream.socket().non_blocking(true, ec);
  c->stream.expires_never();
  // Room for the 16 KiB the session reads at once (a response head, a burst of SSE events), allocated
  // once for the life of the connection.
  c->buffer.reserve(16 * 1024);
  co_return connect_result{std::move(c), {}};
}

void connection_pool::give_back(std::size_t rank, connection_ptr connection) {
  if (stopped_ || !connection) return;
  auto& idle = idle_[rank];
  if (idle.size() >= limits_.max_idle_per_rank) return;  // closes it: the pool stays bounded
  connection->stream.expires_never();
  connection->idle_since = std::chrono::steady_clock::now();
  connection->reused = true;
  watch_while_idle(*connection);
  idle.push_back(std::move(connection));
}

void connection_pool::drop_expired(std::size_t rank, std::chrono::steady_clock::time_point now) {
  auto& idle = idle_[rank];
  // Oldest first: everything before the first young connection has expired.
  std::size_t keep_from = 0;
  while (keep_from < idle.size() && now - idle[keep_from]->idle_since >= limits_.idle_timeout) ++keep_from;
  idle.erase(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(keep_from));
  std::erase_if(idle, [](const connection_ptr& c) { return c->broken; });
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
