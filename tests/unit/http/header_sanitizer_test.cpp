#include <catch2/catch.hpp>

#include <string>

#include "dplb/http/error_response.hpp"
#include "dplb/http/header_sanitizer.hpp"

namespace bhttp = boost::beast::http;
using namespace dplb::http;

TEST_CASE("hop-by-hop headers and those named in Connection are stripped, nothing else", "[http]") {
  bhttp::fields f;
  f.insert(bhttp::field::connection, "keep-alive, X-Secret");
  f.insert(bhttp::field::connection, "Upgrade");
  f.insert("X-Secret", "1");
  f.insert(bhttp::field::keep_alive, "timeout=5");
  f.insert(bhttp::field::te, "trailers");
  f.insert(bhttp::field::transfer_encoding, "chunked");
  f.insert(bhttp::field::upgrade, "websocket");
  f.insert(bhttp::field::proxy_authorization, "Basic x");
  f.insert("Proxy-Connection", "keep-alive");
  f.insert(bhttp::field::content_type, "application/json");
  f.insert("X-Kept", "yes");
  strip_hop_by_hop(f);
  std::vector<std::string> left;
  for (const auto& h : f) left.emplace_back(h.name_string());
  CHECK(left == std::vector<std::string>{"Content-Type", "X-Kept"});
}

TEST_CASE("ambiguous framings are refused, and plain ones pass", "[http]") {
  const auto framing = [](std::initializer_list<std::pair<const char*, const char*>> headers) {
    bhttp::fields f;
    for (auto [n, v] : headers) f.insert(n, v);
    auto p = check_request_framing(f);
    return p ? p->status : 0u;
  };
  CHECK(framing({}) == 0);
  CHECK(framing({{"Content-Length", "12"}}) == 0);
  CHECK(framing({{"Transfer-Encoding", "chunked"}}) == 0);
  CHECK(framing({{"Transfer-Encoding", "Chunked"}}) == 0);
  CHECK(framing({{"Content-Length", "3"}, {"Transfer-Encoding", "chunked"}}) == 400);
  CHECK(framing({{"Content-Length", "3"}, {"Content-Length", "3"}}) == 400);
  CHECK(framing({{"Content-Length", "+3"}}) == 400);
  CHECK(framing({{"Content-Length", "99999999999999999999"}}) == 400);
  CHECK(framing({{"Transfer-Encoding", "gzip, chunked"}}) == 501);
  CHECK(framing({{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}}) == 400);
}

TEST_CASE("forwarding headers keep every earlier hop and refuse to grow past the bound", "[http]") {
  bhttp::fields f;
  f.insert("X-Forwarded-For", "10.0.0.1");
  f.insert("X-Forwarded-For", "10.0.0.2, 10.0.0.3");
  f.insert(bhttp::field::via, "1.1 edge");
  REQUIRE(add_forwarding_headers(f, "127.0.0.1"));
  CHECK(f["X-Forwarded-For"] == "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1");
  CHECK(f.count("X-Forwarded-For") == 1);
  CHECK(f[bhttp::field::via] == "1.1 edge, 1.1 dplb");
  CHECK(f["X-Forwarded-Proto"] == "http");

  bhttp::fields huge;
  huge.insert("X-Forwarded-For", std::string(max_forwarding_header_bytes, 'a'));
  CHECK_FALSE(add_forwarding_headers(huge, "127.0.0.1"));
}

TEST_CASE("the end of a request head is found in raw bytes, with folds detected", "[http]") {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  auto whole = find_head_end(head);
  CHECK(whole.complete);
  CHECK_FALSE(whole.folded);
  CHECK(whole.length == head.size() - 2);
  // Fed in growing prefixes, resuming where the last scan stopped, it finds the same end.
  head_scan scan;
  std::size_t from = 0;
  for (std::size_t n = 0; n <= head.size() && !scan.complete; ++n) {
    scan = find_head_end(std::string_view(head).substr(0, n), from);
    if (!scan.complete) from = scan.searched;
    if (n < head.size() - 2) REQUIRE_FALSE(scan.complete);
  }
  CHECK(scan.length == whole.length);

  CHECK(find_head_end("GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n").folded);
  CHECK(find_head_end("GET / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n").folded);
  CHECK_FALSE(find_head_end("\r\nGET / HTTP/1.1\r\nX-A: a b\r\n\r\n").folded);  // leading empty line is allowed
  CHECK_FALSE(find_head_end("GET / HTTP/1.1\r\nHost: x\r\n").complete);
}

TEST_CASE("dplb's own errors use OpenAI's JSON shape", "[http]") {
  CHECK(error_body(503, "no \"rank\"") ==
        R"({"error":{"message":"no \"rank\"","type":"ServiceUnavailableError","param":null,"code":503}})");
  CHECK(error_type_for(400) == "BadRequestError");
  CHECK(error_type_for(599) == "InternalServerError");
}
