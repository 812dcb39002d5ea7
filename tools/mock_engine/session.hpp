#pragma once
// One accepted connection of one rank, served as vLLM (uvicorn) would serve it.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "mock_options.hpp"
#include "rank_state.hpp"

namespace dplb::mock {

// Serves HTTP/1.1 requests on `socket` until the client closes, the connection idles for
// options.keepalive_timeout (closed silently), a request asks to close, or --close-on-request drops one.
// Network errors end the connection and never throw. `options` and `rank` must outlive the coroutine.
boost::asio::awaitable<void> serve_connection(boost::asio::ip::tcp::socket socket,
                                              const mock_options& options, rank_state& rank);

}  // namespace dplb::mock
