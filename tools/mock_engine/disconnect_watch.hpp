#pragma once
// How the mock learns that a client gave up: the way vLLM does, by the connection closing, whether
// or not bytes are flowing at that moment.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace dplb::mock {

// Runs `work` while watching `socket` for the peer's close (EOF or reset). If the peer goes first,
// `work` is cancelled (its pending wait or write completes with operation_aborted) and the result is
// false; otherwise the result is what `work` returned. The socket is only peeked: a pipelined request
// stays in it for the next read (and a pipelining client cannot be watched any further). `work` must
// not read from `socket`. Kept out of session.cpp because the race costs seconds of compile time.
boost::asio::awaitable<bool> unless_disconnected(boost::asio::ip::tcp::socket& socket,
                                                 boost::asio::awaitable<bool> work);

}  // namespace dplb::mock
