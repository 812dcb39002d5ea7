#include "disconnect_watch.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <exception>

namespace dplb::mock {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Completes when the peer closes or resets the connection, or when cancelled.
asio::awaitable<void> wait_for_disconnect(tcp::socket& socket) {
  char byte = 0;
  const auto [ec, n] = co_await socket.async_receive(asio::buffer(&byte, 1), tcp::socket::message_peek,
                                                     asio::as_tuple(asio::use_awaitable));
  if (!ec && n > 0) {
    // Pipelined bytes: the socket tells nothing more until they are read, so wait to be cancelled.
    asio::steady_timer parked(socket.get_executor(), std::chrono::steady_clock::time_point::max());
    co_await parked.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace

asio::awaitable<bool> unless_disconnected(tcp::socket& socket, asio::awaitable<bool> work) {
  using namespace asio::experimental::awaitable_operators;
  try {
    const auto result = co_await (std::move(work) || wait_for_disconnect(socket));
    co_return result.index() == 0 && std::get<0>(result);
  } catch (const std::exception&) {
    // `work` resumed after its cancellation and threw at its next co_await: still an abort.
    co_return false;
  }
}

}  // namespace dplb::mock
