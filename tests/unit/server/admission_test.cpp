#include <catch2/catch.hpp>

#include <boost/asio/buffer.hpp>
#include <string>

#include "dplb/server/admission.hpp"

namespace bhttp = boost::beast::http;
using namespace dplb::server;

namespace {

// Parses a whole request (head and body) as the session does, with the same parser type.
client_request parse(std::string_view wire) {
  request_parser parser;
  parser.eager(true);
  boost::beast::error_code ec;
  const auto used = parser.put(boost::asio::buffer(wire.data(), wire.size()), ec);
  REQUIRE_FALSE(ec);
  REQUIRE(used == wire.size());
  REQUIRE(parser.is_done());
  return parser.release();
}

admission admit_wire(std::string_view wire) {
  auto request = parse(wire);
  return admit(request.base());
}

}  // namespace

TEST_CASE("admission proxies a plain request and routes dplb's own paths", "[server][admission]") {
  auto plain = admit_wire("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  CHECK_FALSE(plain.refused());
  CHECK(plain.route == request_route::proxy);
  CHECK_FALSE(plain.send_continue);
  CHECK(admit_wire("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").route == request_route::metrics);
  CHECK(admit_wire("GET /health?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n").route == request_route::health);
  CHECK(admit_wire("GET /metrics/x HTTP/1.1\r\nHost: x\r\n\r\n").route == request_route::proxy);
}

TEST_CASE("admission refuses what could be read two ways, or is not for an engine", "[server][admission]") {
  const auto status = [](std::string_view wire) { return admit_wire(wire).refusal_status; };
  CHECK(status("GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n") == 400);
  CHECK(status("GET / HTTP/1.1\r\n\r\n") == 400);             // HTTP/1.1 without Host
  CHECK(status("GET / HTTP/1.0\r\n\r\n") == 0);               // HTTP/1.0 may omit it
  CHECK(status("GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n") == 400);
  CHECK(status("TRACE / HTTP/1.1\r\nHost: x\r\n\r\n") == 405);
  CHECK(status("GET ftp://x/ HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
  CHECK(status("GET http:metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 400);                 // no authority
  CHECK(status("GET http://engine:.000/metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 400);   // found by fuzzing
  CHECK(status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na") == 400);
  CHECK(admit_wire("GET / HTTP/1.1\r\nHost: x\r\n\r\n").refusal_message.empty());
  CHECK(admit_wire("GET / HTTP/1.1\r\n\r\n").refusal_message.find("Host") != std::string_view::npos);
}

TEST_CASE("admission rewrites an absolute-form target to its path", "[server][admission]") {
  auto request = parse("GET http://evil.example:9/v1/models?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK_FALSE(admit(request.base()).refused());
  CHECK(request.target() == "/v1/models?x=1");
  auto metrics = parse("GET http://h/metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(admit(metrics.base()).route == request_route::metrics);
}

TEST_CASE("100 Continue is answered to HTTP/1.1 clients only", "[server][admission]") {
  CHECK(admit_wire("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\na").send_continue);
  CHECK_FALSE(admit_wire("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\na").send_continue);
}

TEST_CASE("a chunked request's trailers never reach the engine's head", "[server][admission]") {
  auto request = parse(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Kept: 1\r\n\r\n"
      "3\r\nabc\r\n0\r\nX-Trailer: evil\r\nX-Kept: 2\r\n\r\n");
  CHECK(request.body() == "abc");
  CHECK(request.count("X-Trailer") == 0);
  CHECK(request.count("X-Kept") == 1);
  REQUIRE(prepare_upstream_request(request, "127.0.0.1"));
  CHECK(request[bhttp::field::content_length] == "3");
  CHECK(request.count(bhttp::field::transfer_encoding) == 0);
}

TEST_CASE("the engine's request: no hop-by-hop headers, no Expect, forwarding headers, HTTP/1.1 keep-alive",
          "[server][admission]") {
  auto request = parse(
      "POST /v1/completions HTTP/1.0\r\nHost: client\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
      "Expect: 100-continue\r\nContent-Length: 2\r\n\r\n{}");
  REQUIRE(prepare_upstream_request(request, "10.1.2.3"));
  CHECK(request.version() == 11);
  CHECK(request.count(bhttp::field::connection) == 0);
  CHECK(request.count("X-Hop") == 0);
  CHECK(request.count(bhttp::field::expect) == 0);
  CHECK(request["X-Forwarded-For"] == "10.1.2.3");
  CHECK(request[bhttp::field::via] == "1.1 dplb");
  CHECK(request[bhttp::field::content_length] == "2");
}
