#pragma once
// Private to the session: the watch that notices a client leaving while its request is proxied.

#include <boost/asio/buffer.hpp>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <memory>

#include "dplb/server/deadline_sweeper.hpp"
#include "dplb/support/io_types.hpp"
#include "dplb/upstream/connection_pool.hpp"

namespace dplb::server {

// Shared between a proxied request and the coroutine that watches its client for a disconnect.
struct client_watch {
  bool done = false;                                  // the request is over; the watcher must not touch anything
  bool client_gone = false;                           // the client closed or reset its connection
  upstream::upstream_connection* upstream = nullptr;  // closed by the watcher when the client goes
  io::steady_timer* queue_wait = nullptr;             // a retry's wait for a slot: cancelled when the client goes
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
                         if (watch->queue_wait) watch->queue_wait->cancel();
                         if (watch->upstream) {
                           boost::system::error_code ignored;
                           watch->upstream->stream.socket().close(ignored);
                         }
                       });
}

// The watch over one leg of a request (one exchange with an engine and its relay), for the leg's lifetime.
// It starts at the first deadline sweep `delay` from now (one sweep period: 25 ms with the default timeouts,
// up to twice that): most requests are over by then, and never pay for a watch (a receive and its
// cancellation through the event loop) nor for a sweep. The watch's state outlives it: client_gone is read
// after the leg.
class leg_watch {
 public:
  leg_watch(socket_deadline& client_deadline, io::socket& client, std::shared_ptr<client_watch>& watch,
            std::chrono::steady_clock::duration delay)
      : deadline_(client_deadline), client_(client), watch_(watch) {
    if (!watch_) watch_ = std::make_shared<client_watch>();
    *watch_ = client_watch{};  // a cancelled receive of an earlier leg sees operation_aborted, not this
    deadline_.wake_at(std::chrono::steady_clock::now() + delay, &leg_watch::start, this);
  }
  ~leg_watch() {
    deadline_.cancel_wake();
    watch_->done = true;
    watch_->upstream = nullptr;
    watch_->queue_wait = nullptr;
    if (started_) {
      boost::system::error_code ignored;
      client_.cancel(ignored);
    }
  }
  leg_watch(const leg_watch&) = delete;
  leg_watch& operator=(const leg_watch&) = delete;

 private:
  static void start(void* self) {  // called by the deadline sweeper
    auto& w = *static_cast<leg_watch*>(self);
    w.started_ = true;
    watch_client(w.client_, w.watch_);
  }

  socket_deadline& deadline_;
  io::socket& client_;
  std::shared_ptr<client_watch>& watch_;
  bool started_ = false;
};

// Whether the client's connection is closed (or failed) already, seen without waiting: a one-byte MSG_PEEK
// receive that does not block (the bytes of a pipelined request are no departure). For a moment the watch
// does not cover: between two legs of a request, before the next leg's watch starts.
inline bool client_closed_now(io::socket& socket) {
  char byte = 0;
  const auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace dplb::server
