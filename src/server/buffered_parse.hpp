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
#include "dplb/support/io_types.hpp"

namespace dplb::server {

// Reads from `stream` until `buffer` holds a complete head (bounded by `limit` bytes, under whatever
// deadline the stream has). The head is checked as raw bytes before Beast parses it: Beast silently
// unfolds obs-fold, which RFC 9112 5.2 lets a recipient do only by rejecting or rewriting it, a folded
// header is a classic way to make two parsers disagree, and an unfolded value would live in Beast's
// storage, not in the buffer. Returns bad_field for a fold, header_limit past the limit, end_of_stream
// for a stream that ended before sending anything, or the read's error.
template <class Stream>
io::task<boost::system::error_code> read_head(Stream& stream, boost::beast::flat_buffer& buffer, std::size_t limit) {
  namespace bhttp = boost::beast::http;
  std::size_t searched = 0;  // bytes already known to hold no end of head
  for (;;) {
    const auto head = http::find_head_end({static_cast<const char*>(buffer.data().data()), buffer.size()}, searched);
    if (head.complete) co_return head.folded ? bhttp::error::bad_field : boost::system::error_code{};
    searched = head.searched;
    if (buffer.size() >= limit) co_return bhttp::error::header_limit;
    auto [ec, n] = co_await stream.async_read_some(buffer.prepare(16 * 1024), io::as_result);
    buffer.commit(n);
    if (ec) co_return ec == boost::asio::error::eof && buffer.size() == 0 ? bhttp::error::end_of_stream : ec;
  }
}

// Feeds the buffer to the parser until `done()` holds, as Beast's read operations do before they read.
// Returns need_more when the parser wants bytes that have not arrived (the caller then reads), or the
// parser's error (need_buffer: the body's sink is full).
template <bool is_request, class Done>
boost::system::error_code parse_buffered(boost::beast::http::basic_parser<is_request>& parser,
                                         boost::beast::flat_buffer& buffer, Done done) {
  boost::system::error_code ec;
  while (!done()) {
    if (buffer.size() == 0) return boost::beast::http::error::need_more;
    const auto used = parser.put(buffer.data(), ec);
    buffer.consume(used);
    if (ec) return ec;
  }
  return ec;
}

}  // namespace dplb::server
