#pragma once
// Private to the session: the watch that notices a client leaving while its request is proxied.

#include <boost/asio/buffer.hpp>
#include <memory>

#include "dplb/support/io_types.hpp"
#include "dplb/upstream/connection_pool.hpp"

namespace dplb::server {

// Shared between a proxied request and the coroutine that watches its client for a disconnect.
struct client_watch {
  bool done = false;                                  // the request is over; the watcher must not touch anything
  bool client_gone = false;                           // the client closed or reset its connection
  upstream::upstream_connection* upstream = nullptr;  // closed by the watcher when the client goes
  char probe = 0;  // where the watch's MSG_PEEK copies a byte (never read; nothing is consumed)
};

// Watches the client's socket while its request is proxied. Bytes arriving there are a pipelined next
// request (left in the socket for the session to read); end-of-file or an error is the client leaving,
// and the engine connection is closed at once so the engine aborts the request and frees its KV cache.
//
// The watch is a one-byte MSG_PEEK receive with a plain completion handler: Asio arms an async_wait with
// an epoll_ctl call every time, while a receive on a socket already registered for input costs no system
// call until the socket becomes readable; and a handler costs less than a coroutine per request.
inline void watch_client(io::socket& socket, std::shared_ptr<client_watch> watch) {
  auto* probe = &watch->probe;
  socket.async_receive(boost::asio::buffer(probe, 1), io::socket::message_peek,
                       [watch = std::move(watch)](const boost::system::error_code& ec, std::size_t n) {
                         // `done` first: the session and its sockets may be gone.
                         if (watch->done || ec == boost::asio::error::operation_aborted) return;
                         if (!ec && n > 0) return;  // a pipelined request: not a disconnect
                         watch->client_gone = true;  // end of file or an error: the client left
                         if (watch->upstream) {
                           boost::system::error_code ignored;
                           watch->upstream->stream.socket().close(ignored);
                         }
                       });
}

}  // namespace dplb::server
