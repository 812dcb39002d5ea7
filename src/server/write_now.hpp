#pragma once
// Private to the session: a write that goes through the event loop only when it has to. Asio's async_write
// tries the write at once too, but even when the kernel takes every byte its completion is posted to the
// event loop and resumes the coroutine from there: a handler, a scheduler lock, a coroutine frame for the
// operation, per write. A socket in non-blocking mode is written here directly instead; only what the
// kernel did not take (a client that reads slowly) is left to an asynchronous write.
//
//   auto now = write_now(socket, pieces);
//   if (now.rest_pending()) {
//     boost::beast::buffers_suffix rest(pieces);
//     rest.consume(now.written);
//     auto [ec, n] = co_await boost::asio::async_write(socket, rest, io::as_result);
//   }

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>

#include <cstddef>

#include "dplb/support/io_types.hpp"

namespace dplb::server {

struct immediate_write {
  boost::system::error_code ec;  // a failure: nothing more is to be written
  std::size_t written = 0;
  std::size_t total = 0;

  bool rest_pending() const noexcept { return !ec && written < total; }
};

// `socket` must be in non-blocking mode (socket.non_blocking(true)), and have no other write in progress.
template <class Buffers>
immediate_write write_now(io::socket& socket, const Buffers& buffers) {
  immediate_write result;
  result.total = boost::asio::buffer_size(buffers);
  if (result.total == 0) return result;
  result.written = socket.write_some(buffers, result.ec);
  if (result.ec == boost::asio::error::would_block || result.ec == boost::asio::error::try_again) {
    result.ec = {};  // the kernel's buffer is full: everything goes asynchronously
    result.written = 0;
  }
  return result;
}

}  // namespace dplb::server
