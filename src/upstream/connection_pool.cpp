#include "dplb/upstream/connection_pool.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <utility>

#include "dplb/support/supervisor.hpp"

namespace dplb::upstream {

namespace asio = boost::asio;

namespace {

// Whether a connection that waited in the pool is still fit to carry a request: the engine has neither
// closed it nor sent a byte since its last response (a byte nobody asked for would be read as the next
// client's answer). One non-blocking MSG_PEEK read, at the moment the connection is taken: EAGAIN is the
// only clean answer. (A watch armed while the connection waits, a MSG_PEEK receive, cost the same read
// when it was armed, plus its cancellation through the event loop, and could still be overtaken: its
// completion might be queued, unrun, when the connection was taken.)
bool still_clean(upstream_connection& connection) {
  char probe = 0;
  const auto n = ::recv(connection.stream.socket().native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

connection_pool::connection_pool(io::executor executor, const topology& topology, pool_limits limits)
    : executor_(executor), topology_(topology), limits_(limits), idle_(topology.backends().size()),
      sweep_timer_(executor) {}

std::vector<connection_ptr>& connection_pool::idle_list(std::size_t backend) {
  if (backend >= idle_.size()) idle_.resize(backend + 1);
  return idle_[backend];
}

connection_ptr connection_pool::take_idle(std::size_t backend) {
  auto& idle = idle_list(backend);
  const auto now = std::chrono::steady_clock::now();
  while (!idle.empty()) {
    connection_ptr c = std::move(idle.back());
    idle.pop_back();
    // LIFO: the freshest connection is the least likely to have been closed by the engine. An old
    // one is dropped here rather than raced against the engine's own keep-alive timeout.
    if (now - c->idle_since >= limits_.idle_timeout || !still_clean(*c)) continue;  // closed as it goes
    return c;
  }
  return nullptr;
}

io::task<connect_result> connection_pool::connect(std::size_t backend) {
  auto c = std::make_unique<upstream_connection>(executor_);
  c->stream.expires_after(limits_.connect_timeout);
  auto [ec, endpoint] = co_await c->stream.async_connect(topology_.backends()[backend].endpoints, io::as_result);
  if (ec) co_return connect_result{nullptr, ec};
  // Small requests and SSE events must leave at once, not wait for Nagle's algorithm.
  c->stream.socket().set_option(asio::ip::tcp::no_delay(true), ec);
  // The request is written directly when the kernel takes it, without the event loop (the session's
  // write_now); asynchronous operations are unaffected.
  c->stream.socket().non_blocking(true, ec);
  c->stream.expires_never();
  co_return connect_result{std::move(c), {}};
}

void connection_pool::give_back(std::size_t backend, connection_ptr connection) {
  if (stopped_ || !connection) return;
  auto& idle = idle_list(backend);
  if (idle.size() >= limits_.max_idle_per_rank * topology_.backends()[backend].dp) return;  // closes it: the pool stays bounded
  connection->stream.expires_never();
  io::release_if_empty(connection->buffer);  // its next read takes a block again
  connection->idle_since = std::chrono::steady_clock::now();
  connection->reused = true;
  idle.push_back(std::move(connection));
}

void connection_pool::drop_expired(std::size_t backend, std::chrono::steady_clock::time_point now) {
  auto& idle = idle_[backend];
  // Oldest first: everything before the first young connection has expired.
  std::size_t keep_from = 0;
  while (keep_from < idle.size() && now - idle[keep_from]->idle_since >= limits_.idle_timeout) ++keep_from;
  idle.erase(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(keep_from));
  // And those the engine closed or wrote to meanwhile: closed now rather than left in CLOSE_WAIT until
  // they are taken or too old.
  std::erase_if(idle, [](const connection_ptr& c) { return !still_clean(*c); });
}

io::task<void> connection_pool::sweep_loop() {
  // Without the sweep, a connection the engine closed would sit in CLOSE_WAIT until the next request
  // to that backend; the period is a quarter of the idle timeout so nothing lingers much beyond it. (One
  // MSG_PEEK read per idle connection per period.)
  const auto period = std::max(limits_.idle_timeout / 4, std::chrono::milliseconds(50));
  while (!stopped_) {
    sweep_timer_.expires_after(period);
    auto [ec] = co_await sweep_timer_.async_wait(io::as_result);
    if (ec || stopped_) break;
    support::fault_point(support::task::pool_sweep);
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t backend = 0; backend < idle_.size(); ++backend) drop_expired(backend, now);
  }
}

void connection_pool::stop() {
  stopped_ = true;
  sweep_timer_.cancel();
  for (auto& idle : idle_) idle.clear();
}

}  // namespace dplb::upstream
