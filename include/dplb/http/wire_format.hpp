#pragma once
// Message heads and chunk framing written straight into bytes. The relay's hot path sends a head and the
// body bytes that follow it in one gathered write; Beast's serializer costs about a third of dplb's CPU
// per request (profiled with callgrind: nested buffer views and a dozen tiny iovecs per head), so the
// bytes are laid out here instead. The output is what Beast's serializer writes for the same message
// (tested byte for byte in tests/unit/http/wire_format_test.cpp).

#include <cstddef>
#include <string>
#include <string_view>

namespace dplb::http {

// "HTTP/1.1 status reason\r\n". The reason is the engine's own, or the standard one when it sent none.
void append_status_line(std::string& out, unsigned status, std::string_view reason);

// "Name: value\r\n".
inline void append_field(std::string& out, std::string_view name, std::string_view value) {
  out += name;
  out += ": ";
  out += value;
  out += "\r\n";
}

// A decimal number, as a field value is written.
void append_decimal(std::string& out, std::size_t value);

// The line that opens a chunk of `size` bytes: hexadecimal size, "\r\n". The chunk's data follows and
// "\r\n" closes it; a chunked body ends with last_chunk.
void append_chunk_header(std::string& out, std::size_t size);
inline constexpr std::string_view chunk_end = "\r\n";
inline constexpr std::string_view last_chunk = "0\r\n\r\n";

}  // namespace dplb::http
