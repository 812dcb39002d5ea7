#pragma once
// Private to the session: reading a whole head before it is parsed, and parsing what a buffer already
// holds without I/O. A head is parsed only once it is whole in the buffer, so that the views the parsers
// record (http/message_head.hpp) point into one contiguous run of bytes; a small body usually arrived with
// the head, and a small response usually arrives whole with its head. Beast's asynchronous reads would
// parse those bytes too, but through a composed operation and a post to the event loop each time; the
// asynchronous read is needed only for bytes that have not arrived.

#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>

#include <cstddef>

#include "dplb/http/header_sanitizer.hpp"
#include "dplb/support/io_buffers.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::server {

// Reads a head whole into `buffer` (bounded by `limit` bytes, under whatever deadline the socket has)
// before it is parsed. The head is checked as raw bytes first: Beast silently unfolds obs-fold, which
// RFC 9112 5.2 lets a recipient do only by rejecting or rewriting it, a folded header is a classic way to
// make two parsers disagree, and an unfolded value would live in Beast's storage, not in the buffer.
// The caller runs the reads, so that a head costs no coroutine of its own:
//
//   head_reader reader(buffer, limit);
//   auto ec = reader.scan();
//   while (ec == need_more) {
//     auto [read_ec, n] = co_await socket.async_read_some(reader.space(), io::as_result);
//     ec = reader.read(read_ec, n);
//   }
//
// The result is empty once a whole head is in the buffer; bad_field for a fold, header_limit past the
// limit, end_of_stream for a stream that ended before sending anything, or the read's error.
class head_reader {
 public:
  static constexpr auto need_more = boost::beast::http::error::need_more;

  head_reader(io::read_buffer& buffer, std::size_t limit) noexcept : buffer_(buffer), limit_(limit) {}

  boost::system::error_code scan() noexcept {
    namespace bhttp = boost::beast::http;
    scan_ = http::find_head_end({static_cast<const char*>(buffer_.data().data()), buffer_.size()}, scan_);
    if (scan_.complete) return scan_.folded ? bhttp::error::bad_field : boost::system::error_code{};
    if (buffer_.size() >= limit_) return bhttp::error::header_limit;
    return need_more;
  }

  // Where the next read goes: a large block (io_buffers.hpp) when the buffer is empty.
  io::read_buffer::mutable_buffers_type space() { return buffer_.prepare(io::large_block_size); }

  // Takes a read's result and scans again.
  boost::system::error_code read(const boost::system::error_code& ec, std::size_t n) {
    buffer_.commit(n);
    if (ec) {
      return ec == boost::asio::error::eof && buffer_.size() == 0 ? boost::beast::http::error::end_of_stream : ec;
    }
    return scan();
  }

 private:
  io::read_buffer& buffer_;
  std::size_t limit_;
  http::head_scan scan_;  // what is known of the bytes already searched
};

// Feeds the buffer to the parser until `done()` holds, as Beast's read operations do before they read.
// Returns need_more when the parser wants bytes that have not arrived (the caller then reads), or the
// parser's error (need_buffer: the body's sink is full).
template <bool is_request, class Done>
boost::system::error_code parse_buffered(boost::beast::http::basic_parser<is_request>& parser,
                                         io::read_buffer& buffer, Done done) {
  static const boost::system::error_code need_more = boost::beast::http::error::need_more;
  boost::system::error_code ec;
  while (!done()) {
    if (buffer.size() == 0) return need_more;
    const auto used = parser.put(buffer.data(), ec);
    buffer.consume(used);
    if (ec) return ec;
  }
  return ec;
}

}  // namespace dplb::server
