#include <catch2/catch.hpp>

#include <boost/beast/http.hpp>
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

TEST_CASE("a request head is written as Beast writes it", "[http][wire]") {
  bhttp::request<bhttp::string_body> request{bhttp::verb::post, "/v1/completions?x=1", 11};
  request.set(bhttp::field::host, "10.0.0.1:8000");
  request.set(bhttp::field::content_type, "application/json");
  request.insert("X-Forwarded-For", "1.2.3.4, 5.6.7.8");
  request.insert("x-custom", "");  // an empty value
  request.insert("X-Dup", "a");
  request.insert("X-Dup", "b");  // repeated fields keep their order
  request.content_length(42);
  std::string out;
  append_request_head(out, request.base());
  CHECK(out == beast_head(request.base()));
  CHECK(out.ends_with("\r\n\r\n"));

  bhttp::request<bhttp::empty_body> unknown_method;
  unknown_method.method_string("PURGE");
  unknown_method.target("/");
  unknown_method.version(10);
  out.clear();
  append_request_head(out, unknown_method.base());
  CHECK(out == beast_head(unknown_method.base()));
}

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
    std::string out;
    append_response_head(out, response.base());
    CHECK(out == beast_head(response.base()));
  }
  bhttp::response<bhttp::empty_body> custom;
  custom.result(200);
  custom.reason("Fine Thanks");
  std::string out;
  append_response_head(out, custom.base());
  CHECK(out.starts_with("HTTP/1.1 200 Fine Thanks\r\n"));
  CHECK(out == beast_head(custom.base()));
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
  std::string ours;
  append_response_head(ours, response.base());
  append_chunk_header(ours, 300);
  ours += response.body();
  ours += chunk_end;
  ours += last_chunk;
  CHECK(ours == os.str());
}
