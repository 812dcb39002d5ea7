#pragma once
// The proxy's I/O types, bound to the concrete executor of an io_context. Asio's default executor,
// any_io_executor, is type-erased: every asynchronous operation copies, moves and destroys it through
// function pointers, which callgrind put at 20% (plain requests) to 39% (SSE relay) of dplb's user-space
// instructions. Every worker runs exactly one io_context, so nothing here needs the erasure. Side
// channels that are not on the request path (health checks, engine stats) keep Asio's defaults.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <chrono>

namespace dplb::io {

using executor = boost::asio::io_context::executor_type;

// A coroutine of the proxy: `io::task<bool> f()` instead of `asio::awaitable<bool> f()`.
template <class T>
using task = boost::asio::awaitable<T, executor>;

inline constexpr boost::asio::use_awaitable_t<executor> use_task{};
// The completion token of the request path: errors come back as values, (ec, result...), never thrown.
inline constexpr auto as_result = boost::asio::as_tuple(use_task);

using socket = boost::asio::basic_stream_socket<boost::asio::ip::tcp, executor>;
using acceptor = boost::asio::basic_socket_acceptor<boost::asio::ip::tcp, executor>;
using steady_timer = boost::asio::basic_waitable_timer<std::chrono::steady_clock,
                                                       boost::asio::wait_traits<std::chrono::steady_clock>, executor>;
using tcp_stream = boost::beast::basic_stream<boost::asio::ip::tcp, executor, boost::beast::unlimited_rate_policy>;

}  // namespace dplb::io
