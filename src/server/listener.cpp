#include "dplb/server/listener.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "dplb/server/session.hpp"

namespace dplb::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

tcp::acceptor open_acceptor(const asio::any_io_executor& executor, const tcp::endpoint& endpoint) {
  tcp::acceptor acceptor(executor);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
  return acceptor;
}

asio::awaitable<void> accept_loop(worker_state& worker, tcp::acceptor& acceptor) {
  auto executor = co_await asio::this_coro::executor;
  while (acceptor.is_open()) {
    auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
    if (ec) {
      // Typically EMFILE: out of file descriptors. Back off briefly instead of spinning on the error.
      spdlog::warn("accept failed: {}; retrying in 100 ms", ec.message());
      asio::steady_timer pause(executor, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      continue;
    }
    asio::co_spawn(executor, run_session(worker, std::move(socket)), asio::detached);
  }
}

}  // namespace dplb::server
