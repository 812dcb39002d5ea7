#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "dplb/http/error_response.hpp"
#include "dplb/http/header_sanitizer.hpp"

namespace bhttp = boost::beast::http;
using namespace dplb::http;

namespace {

std::vector<std::string> crossing(const field_list& fields) {
  const connection_options options(fields);
  std::vector<std::string> names;
  for (const auto& field : fields) {
    if (crosses(field, options)) names.emplace_back(field.name_string);
  }
  return names;
}

}  // namespace

TEST_CASE("hop-by-hop headers and those named in Connection do not cross, nothing else", "[http]") {
  field_list f;
  f.add(bhttp::field::connection, "Connection", "keep-alive, X-Secret");
  f.add(bhttp::field::connection, "Connection", "Upgrade");
  f.add(bhttp::field::unknown, "x-secret", "1");  // names compare without case
  f.add(bhttp::field::keep_alive, "Keep-Alive", "timeout=5");
  f.add(bhttp::field::te, "TE", "trailers");
  f.add(bhttp::field::transfer_encoding, "Transfer-Encoding", "chunked");
  f.add(bhttp::field::upgrade, "Upgrade", "websocket");
  f.add(bhttp::field::proxy_authorization, "Proxy-Authorization", "Basic x");
  f.add(bhttp::field::proxy_authenticate, "Proxy-Authenticate", "Basic");
  f.add(bhttp::field::proxy_connection, "Proxy-Connection", "keep-alive");
  f.add(bhttp::field::content_type, "Content-Type", "application/json");
  f.add(bhttp::field::unknown, "X-Kept", "yes");
  CHECK(crossing(f) == std::vector<std::string>{"Content-Type", "X-Kept"});
}

TEST_CASE("a Content-Length named in Connection still crosses: framing is never named away", "[http]") {
  field_list f;
  f.add(bhttp::field::connection, "Connection", "Content-Length, Transfer-Encoding, X-Other");
  f.add(bhttp::field::content_length, "Content-Length", "5");
  f.add(bhttp::field::transfer_encoding, "Transfer-Encoding", "chunked");
  f.add(bhttp::field::unknown, "X-Other", "1");
  CHECK(crossing(f) == std::vector<std::string>{"Content-Length"});
}

TEST_CASE("Connection options are bounded", "[http]") {
  field_list f;
  std::string many;
  for (std::size_t i = 0; i <= connection_options::max_options; ++i) many += "x" + std::to_string(i) + ", ";
  f.add(bhttp::field::connection, "Connection", many);
  CHECK(connection_options(f).too_many());
  f.clear();
  f.add(bhttp::field::connection, "Connection", " , close ,, ");  // empty items are no options
  CHECK_FALSE(connection_options(f).too_many());
  CHECK(connection_options(f).names("Close"));
  CHECK_FALSE(connection_options(f).names(""));
}

TEST_CASE("the end of a request head is found in raw bytes, with folds detected", "[http]") {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  auto whole = find_head_end(head);
  CHECK(whole.complete);
  CHECK_FALSE(whole.folded);
  CHECK(whole.length == head.size() - 2);
  // Fed in growing prefixes, resuming where the last scan stopped, it finds the same end.
  head_scan scan;
  for (std::size_t n = 0; n <= head.size() && !scan.complete; ++n) {
    scan = find_head_end(std::string_view(head).substr(0, n), scan);
    if (n < head.size() - 2) REQUIRE_FALSE(scan.complete);
  }
  CHECK(scan.length == whole.length);
  CHECK_FALSE(scan.folded);
  // A fold early in a head that arrives in pieces is still seen when the end arrives.
  const std::string folded = "GET / HTTP/1.1\r\nX-A: a\r\n b\r\nX-B: " + std::string(100, 'c') + "\r\n\r\n";
  scan = {};
  for (std::size_t n = 0; n <= folded.size() && !scan.complete; ++n) {
    scan = find_head_end(std::string_view(folded).substr(0, n), scan);
  }
  CHECK(scan.complete);
  CHECK(scan.folded);

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
