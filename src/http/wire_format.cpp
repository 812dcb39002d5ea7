#include "dplb/http/wire_format.hpp"

#include <boost/beast/http/status.hpp>

#include <charconv>

namespace dplb::http {

void append_status_line(std::string& out, unsigned status, std::string_view reason) {
  out += "HTTP/1.1 ";
  const char digits[3] = {static_cast<char>('0' + status / 100 % 10), static_cast<char>('0' + status / 10 % 10),
                          static_cast<char>('0' + status % 10)};
  out.append(digits, 3);
  out += ' ';
  out += reason.empty() ? std::string_view(boost::beast::http::obsolete_reason(boost::beast::http::int_to_status(status)))
                        : reason;
  out += "\r\n";
}

void append_decimal(std::string& out, std::size_t value) {
  char digits[20];
  out.append(digits, std::to_chars(digits, digits + sizeof digits, value).ptr);
}

void append_chunk_header(std::string& out, std::size_t size) {
  char digits[2 * sizeof(std::size_t)];
  char* end = digits + sizeof digits;
  char* p = end;
  do {
    *--p = "0123456789abcdef"[size & 0xf];
    size >>= 4;
  } while (size != 0);
  out.append(p, end);
  out += "\r\n";
}

}  // namespace dplb::http
