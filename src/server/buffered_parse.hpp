#pragma once
// Private to the session: parsing what a buffer already holds, without I/O. A client's head is whole in
// the session's buffer before it is parsed (read_raw_head), a small body usually arrived with it, and a
// small response usually arrives whole with its head. Beast's asynchronous reads would parse those bytes
// too, but through a composed operation and a post to the event loop each time; the asynchronous read is
// needed only for bytes that have not arrived.

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>

namespace dplb::server {

// Feeds the buffer to the parser until `done()` holds, as Beast's read operations do before they read.
// Returns need_more when the parser wants bytes that have not arrived (the caller then reads), or the
// parser's error (need_buffer: a buffer_body is full).
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
