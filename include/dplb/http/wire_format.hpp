#pragma once
// Message heads and chunk framing written straight into bytes. The relay's hot path sends a head and the
// body bytes that follow it in one gathered write; Beast's serializer costs about a third of dplb's CPU
// per request (profiled with callgrind: nested buffer views and a dozen tiny iovecs per head), so the
// bytes are laid out here instead. The output is what Beast's serializer writes for the same message
// (tested byte for byte in tests/unit/http/wire_format_test.cpp).

#include <boost/beast/http/message.hpp>
#include <cstddef>
#include <string>

namespace dplb::http {

// "METHOD target HTTP/1.1\r\n" then every field as "Name: value\r\n", then "\r\n".
void append_request_head(std::string& out, const boost::beast::http::request_header<>& head);

// "HTTP/1.1 status reason\r\n", the fields, "\r\n". The reason is the head's own, or the standard one.
void append_response_head(std::string& out, const boost::beast::http::response_header<>& head);

// The line that opens a chunk of `size` bytes: hexadecimal size, "\r\n". The chunk's data follows and
// "\r\n" closes it; a chunked body ends with last_chunk.
void append_chunk_header(std::string& out, std::size_t size);
inline constexpr std::string_view chunk_end = "\r\n";
inline constexpr std::string_view last_chunk = "0\r\n\r\n";

}  // namespace dplb::http
