#pragma once
// One accepted connection of one rank, served as vLLM (uvicorn) would serve it, with the rank's
// injected faults; and one connection of the admin port that sets them.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <string_view>

#include "admin_api.hpp"
#include "connection_registry.hpp"
#include "mock_options.hpp"
#include "rank_state.hpp"

namespace dplb::mock {

// Serves HTTP/1.1 requests on `socket` until the client closes, the connection idles for
// options.keepalive_timeout (closed silently), a request asks to close, --close-on-request drops one,
// or a fault ends it (rank.faults, read at each step that they affect). The connection is in
// `registry` for its lifetime, so that "listening": false can close it. Network errors end the
// connection and never throw. `options`, `rank` and `registry` must outlive the coroutine, which must
// run on the thread that owns `registry`.
boost::asio::awaitable<void> serve_connection(boost::asio::ip::tcp::socket socket,
                                              const mock_options& options, rank_state& rank,
                                              connection_registry& registry);

// Executes the admin port's requests; implemented by the server, which owns the listeners.
class admin_handler {
 public:
  // The views stay valid until the returned awaitable completes.
  virtual boost::asio::awaitable<admin_answer> handle(std::string_view method, std::string_view target,
                                                      std::string_view body) = 0;

 protected:
  ~admin_handler() = default;
};

// Serves admin requests (keep-alive, bodies up to 1 MiB, 60 s idle) on `socket`, answering each with
// what `admin` returns. `admin` must outlive the coroutine.
boost::asio::awaitable<void> serve_admin_connection(boost::asio::ip::tcp::socket socket,
                                                    admin_handler& admin);

}  // namespace dplb::mock
