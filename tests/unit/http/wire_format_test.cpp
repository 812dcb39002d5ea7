#include <catch2/catch.hpp>

#include <boost/beast/http.hpp>
#include <limits>
#include <sstream>

#include "dplb/http/wire_format.hpp"

namespace bhttp = boost::beast::http;
using namespace dplb::http;

namespace {

template <bool is_request>
std::string beast_head(const bhttp::header<is_request>& head) {
  std::ostringstream os;
  os << head;  // Beast's own serializer
  return os.str();
}

}  // namespace

namespace {

// A response head as the relay writes it: the status line, then each field.
std::string our_head(const bhttp::response_header<>& head) {
  std::string out;
  append_status_line(out, head.result_int(), head.reason());
  for (const auto& field : head) append_field(out, field.name_string(), field.value());
  out += "\r\n";
  return out;
}

}  // namespace

TEST_CASE("a response head is written as Beast writes it, with the engine's reason or the standard one",
          "[http][wire]") {
  for (const unsigned status : {200u, 201u, 204u, 400u, 404u, 429u, 499u, 500u, 503u, 599u}) {
    INFO(status);
    bhttp::response<bhttp::empty_body> response;
    response.result(status);
    response.version(11);
    response.set(bhttp::field::content_type, "text/event-stream");
    response.chunked(true);
    response.set("x-dplb-rank", "3");
    response.insert("X-Dup", "a");
    response.insert("X-Dup", "b");  // repeated fields keep their order
    response.insert("x-empty", "");
    CHECK(our_head(response.base()) == beast_head(response.base()));
  }
  bhttp::response<bhttp::empty_body> custom;
  custom.result(200);
  custom.reason("Fine Thanks");
  const auto out = our_head(custom.base());
  CHECK(out.starts_with("HTTP/1.1 200 Fine Thanks\r\n"));
  CHECK(out == beast_head(custom.base()));
}

TEST_CASE("numbers are written in decimal", "[http][wire]") {
  for (const std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{10}, std::size_t{123456789},
                              std::numeric_limits<std::size_t>::max()}) {
    std::string out = "x";
    append_decimal(out, n);
    CHECK(out == "x" + std::to_string(n));
  }
}

TEST_CASE("chunk framing matches Beast's chunked serializer", "[http][wire]") {
  for (const std::size_t size : {std::size_t{1}, std::size_t{9}, std::size_t{10}, std::size_t{15}, std::size_t{16},
                                 std::size_t{255}, std::size_t{4096}, std::size_t{16384}, std::size_t{123456789}}) {
    INFO(size);
    std::string out;
    append_chunk_header(out, size);
    std::ostringstream hex;
    hex << std::hex << size << "\r\n";
    CHECK(out == hex.str());
  }
  // A whole chunked body, compared with what Beast writes for the same body.
  bhttp::response<bhttp::string_body> response{bhttp::status::ok, 11};
  response.body() = std::string(300, 'x');
  response.chunked(true);
  std::ostringstream os;
  os << response;
  std::string ours = our_head(response.base());
  append_chunk_header(ours, 300);
  ours += response.body();
  ours += chunk_end;
  ours += last_chunk;
  CHECK(ours == os.str());
}
