#include "dplb/http/wire_format.hpp"

namespace dplb::http {

namespace bhttp = boost::beast::http;

namespace {

void append_fields(std::string& out, const bhttp::fields& fields) {
  for (const auto& field : fields) {
    out += field.name_string();
    out += ": ";
    out += field.value();
    out += "\r\n";
  }
  out += "\r\n";
}

}  // namespace

void append_request_head(std::string& out, const bhttp::request_header<>& head) {
  out += head.method_string();
  out += ' ';
  out += head.target();
  out += head.version() == 10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n";
  append_fields(out, head);
}

void append_response_head(std::string& out, const bhttp::response_header<>& head) {
  out += head.version() == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  const unsigned status = head.result_int();
  char digits[3] = {static_cast<char>('0' + status / 100 % 10), static_cast<char>('0' + status / 10 % 10),
                    static_cast<char>('0' + status % 10)};
  out.append(digits, 3);
  out += ' ';
  const auto reason = head.reason();
  out += reason.empty() ? bhttp::obsolete_reason(head.result()) : reason;
  out += "\r\n";
  append_fields(out, head);
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
