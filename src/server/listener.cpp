#include "dplb/server/listener.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "dplb/http/error_response.hpp"
#include "dplb/server/session.hpp"
#include "dplb/support/supervisor.hpp"

#include <boost/asio/write.hpp>
#include <boost/beast/core/tcp_stream.hpp>

namespace dplb::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

io::acceptor open_acceptor(const io::executor& executor, const tcp::endpoint& endpoint) {
  io::acceptor acceptor(executor);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
  return acceptor;
}

namespace {

// Over --max-client-connections: a clear answer instead of a silent reset, then close. The write is
// bounded so that a client that never reads cannot hold the socket.
io::task<void> refuse_connection(worker_state& worker, io::socket socket) {
  worker.shared.metrics.rejected(503);
  static const std::string response = [] {
    const std::string body = http::error_body(503, "dplb is at its client connection limit (--max-client-connections); retry later");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
           "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  io::tcp_stream stream(std::move(socket));
  stream.expires_after(std::chrono::seconds(1));
  co_await asio::async_write(stream, asio::buffer(response), io::as_result);
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

}  // namespace

io::task<void> accept_loop(worker_state& worker, io::acceptor& acceptor) {
  auto executor = co_await asio::this_coro::executor;
  while (acceptor.is_open()) {
    support::fault_point(support::task::accept);
    auto [ec, socket] = co_await acceptor.async_accept(io::as_result);
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
    if (ec) {
      // Typically EMFILE: out of file descriptors. Back off briefly instead of spinning on the error.
      spdlog::warn("accept failed: {}; retrying in 100 ms", ec.message());
      io::steady_timer pause(executor, std::chrono::milliseconds(100));
      co_await pause.async_wait(io::as_result);
      continue;
    }
    auto& shared = worker.shared;
    if (shared.client_connections.fetch_add(1, std::memory_order_relaxed) >= shared.settings.max_client_connections) {
      shared.client_connections.fetch_sub(1, std::memory_order_relaxed);
      asio::co_spawn(executor, refuse_connection(worker, std::move(socket)), support::logged_on_failure("a refused client connection"));
      continue;
    }
    asio::co_spawn(executor, run_session(worker, std::move(socket)), support::logged_on_failure("a client session"));
  }
}

}  // namespace dplb::server
