#include <catch2/catch.hpp>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>

#include <memory>
#include <string>

#include "dplb/http/header_sanitizer.hpp"
#include "dplb/server/admission.hpp"

namespace bhttp = boost::beast::http;
using namespace dplb::server;
using dplb::http::request_head;
using dplb::http::request_head_parser;

namespace {

// A request parsed as the session parses it, with the same parser: views into `wire`, which the test
// keeps alive.
struct parsed_request {
  explicit parsed_request(std::string text) : wire(std::move(text)) {
    request_head_parser parser(head, body);
    parser.header_limit(1024 * 1024);
    parser.eager(true);
    boost::beast::error_code ec;
    const auto used = parser.put(boost::asio::buffer(wire.data(), wire.size()), ec);
    REQUIRE_FALSE(ec);
    REQUIRE(used == wire.size());
    REQUIRE(parser.is_done());
  }
  std::string wire;
  request_head head;
  std::string body;
};

// A decision with the request it was made on: its target is a view into the request's bytes, which must
// outlive it (a decision returned alone viewed freed memory).
struct admitted_request : admission {
  std::shared_ptr<const parsed_request> request;
};

admitted_request admit_wire(std::string wire) {
  auto request = std::make_shared<const parsed_request>(std::move(wire));
  return admitted_request{admit(request->head), request};
}

// The engine's request as it goes on the wire (Host of a rank, body read), parsed back by Beast.
bhttp::request<bhttp::string_body> upstream_request(const parsed_request& request, std::string_view client_address) {
  const auto decision = admit(request.head);
  REQUIRE_FALSE(decision.refused());
  upstream_head head;
  REQUIRE(prepare_upstream_request(request.head, decision.target(), client_address, head));
  set_upstream_framing(head, request.head.method, request.body.size());
  std::string bytes;
  for (const auto& piece : head.pieces("Host: 127.0.0.1:8001\r\n", request.body)) {
    bytes.append(static_cast<const char*>(piece.data()), piece.size());
  }
  bhttp::request_parser<bhttp::string_body> parser;
  parser.eager(true);
  boost::beast::error_code ec;
  const auto used = parser.put(boost::asio::buffer(bytes), ec);
  REQUIRE_FALSE(ec);
  REQUIRE(parser.is_done());
  REQUIRE(used == bytes.size());  // exactly one request: nothing left over for a second one
  return parser.release();
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
  const auto status = [](std::string wire) { return admit_wire(std::move(wire)).refusal_status; };
  CHECK(status("GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n") == 400);
  CHECK(status("GET / HTTP/1.1\r\n\r\n") == 400);             // HTTP/1.1 without Host
  CHECK(status("GET / HTTP/1.0\r\n\r\n") == 0);               // HTTP/1.0 may omit it
  CHECK(status("GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n") == 400);
  CHECK(status("TRACE / HTTP/1.1\r\nHost: x\r\n\r\n") == 405);
  CHECK(status("GET ftp://x/ HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
  CHECK(status("GET http:metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 400);                 // no authority
  CHECK(status("GET http://engine:.000/metrics HTTP/1.1\r\nHost: x\r\n\r\n") == 400);   // found by fuzzing
  CHECK(admit_wire("GET / HTTP/1.1\r\nHost: x\r\n\r\n").refusal_message.empty());
  CHECK(admit_wire("GET / HTTP/1.1\r\n\r\n").refusal_message.find("Host") != std::string_view::npos);
}

TEST_CASE("ambiguous framings are refused, plain ones pass", "[server][admission]") {
  const auto framing = [](std::string headers, std::string body = "") {
    return admit_wire("POST / HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n" + body).refusal_status;
  };
  CHECK(framing("") == 0);
  CHECK(framing("Content-Length: 0\r\n") == 0);
  CHECK(framing("Transfer-Encoding: chunked\r\n", "0\r\n\r\n") == 0);
  CHECK(framing("Transfer-Encoding: Chunked\r\n", "0\r\n\r\n") == 0);
  CHECK(framing("Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n") == 501);
  // Beast refuses Content-Length with Transfer-Encoding, or two Content-Lengths, itself; the rules are
  // checked here on heads Beast lets through, and on field lists directly below.
  dplb::http::field_list fields;
  const auto check = [&] {
    auto problem = dplb::http::check_request_framing(fields);
    return problem ? problem->status : 0u;
  };
  fields.add(bhttp::field::content_length, "Content-Length", "3");
  CHECK(check() == 0);
  fields.add(bhttp::field::transfer_encoding, "Transfer-Encoding", "chunked");
  CHECK(check() == 400);
  fields.clear();
  fields.add(bhttp::field::content_length, "Content-Length", "3");
  fields.add(bhttp::field::content_length, "Content-Length", "3");
  CHECK(check() == 400);
  fields.clear();
  fields.add(bhttp::field::content_length, "Content-Length", "+3");
  CHECK(check() == 400);
  fields.clear();
  fields.add(bhttp::field::content_length, "Content-Length", "99999999999999999999");
  CHECK(check() == 400);
  fields.clear();
  fields.add(bhttp::field::transfer_encoding, "Transfer-Encoding", "chunked");
  fields.add(bhttp::field::transfer_encoding, "Transfer-Encoding", "chunked");
  CHECK(check() == 400);
}

TEST_CASE("admission rewrites an absolute-form target to its path", "[server][admission]") {
  CHECK(admit_wire("GET http://evil.example:9/v1/models?x=1 HTTP/1.1\r\nHost: x\r\n\r\n").target() ==
        "/v1/models?x=1");
  CHECK(admit_wire("GET http://evil.example?x=1 HTTP/1.1\r\nHost: x\r\n\r\n").target() == "/?x=1");
  CHECK(admit_wire("GET http://h/metrics HTTP/1.1\r\nHost: x\r\n\r\n").route == request_route::metrics);
  // The owned target survives a copy of the decision (a view of it would dangle).
  auto decision = admit_wire("GET http://h HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto copy = decision;
  decision.owned_target = "overwritten";
  CHECK(copy.target() == "/");
}

TEST_CASE("100 Continue is answered to HTTP/1.1 clients only", "[server][admission]") {
  CHECK(admit_wire("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\na").send_continue);
  CHECK_FALSE(admit_wire("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\na").send_continue);
}

TEST_CASE("a chunked request's trailers never reach the engine's head", "[server][admission]") {
  parsed_request request(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Kept: 1\r\n\r\n"
      "3\r\nabc\r\n0\r\nX-Trailer: evil\r\nX-Kept: 2\r\n\r\n");
  CHECK(request.body == "abc");
  CHECK(request.head.fields.count("X-Trailer") == 0);
  CHECK(request.head.fields.count("X-Kept") == 1);
  const auto upstream = upstream_request(request, "127.0.0.1");
  CHECK(upstream[bhttp::field::content_length] == "3");
  CHECK(upstream.count(bhttp::field::transfer_encoding) == 0);
  CHECK(upstream.count("X-Trailer") == 0);
  CHECK(upstream["X-Kept"] == "1");
  CHECK(upstream.body() == "abc");
}

TEST_CASE("the engine's request: no hop-by-hop headers, no Expect, forwarding headers, HTTP/1.1 keep-alive",
          "[server][admission]") {
  parsed_request request(
      "POST /v1/completions HTTP/1.0\r\nHost: client\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
      "Keep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: Basic x\r\n"
      "Proxy-Connection: keep-alive\r\nExpect: 100-continue\r\nContent-Type: application/json\r\n"
      "X-Dup: a\r\nX-Dup: b\r\nContent-Length: 2\r\n\r\n{}");
  const auto upstream = upstream_request(request, "10.1.2.3");
  CHECK(upstream.version() == 11);
  CHECK(upstream.keep_alive());
  CHECK(upstream.target() == "/v1/completions");
  std::vector<std::string> names;
  for (const auto& field : upstream) names.emplace_back(field.name_string());
  CHECK(names == std::vector<std::string>{"Host", "Content-Type", "X-Dup", "X-Dup", "X-Forwarded-For", "Via",
                                          "X-Forwarded-Proto", "Content-Length"});
  CHECK(upstream[bhttp::field::host] == "127.0.0.1:8001");
  CHECK(upstream["X-Forwarded-For"] == "10.1.2.3");
  CHECK(upstream[bhttp::field::via] == "1.1 dplb");
  CHECK(upstream["X-Forwarded-Proto"] == "http");
  CHECK(upstream[bhttp::field::content_length] == "2");
  CHECK(upstream.body() == "{}");
}

TEST_CASE("a Content-Length named in Connection stays: framing is never named away", "[server][admission]") {
  parsed_request request(
      "POST / HTTP/1.1\r\nHost: x\r\nConnection: Content-Length, X-Other\r\nX-Other: 1\r\nContent-Length: 2\r\n\r\n{}");
  const auto upstream = upstream_request(request, "127.0.0.1");
  CHECK(upstream[bhttp::field::content_length] == "2");
  CHECK(upstream.count("X-Other") == 0);
}

TEST_CASE("forwarding headers keep every earlier hop and refuse to grow past the bound", "[server][admission]") {
  parsed_request request(
      "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1\r\nx-forwarded-for: 10.0.0.2, 10.0.0.3\r\n"
      "Via: 1.1 edge\r\nX-Forwarded-Proto: https\r\n\r\n");
  const auto upstream = upstream_request(request, "127.0.0.1");
  CHECK(upstream["X-Forwarded-For"] == "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1");
  CHECK(upstream.count("X-Forwarded-For") == 1);
  CHECK(upstream[bhttp::field::via] == "1.1 edge, 1.1 dplb");
  CHECK(upstream["X-Forwarded-Proto"] == "http");
  CHECK(upstream.count("X-Forwarded-Proto") == 1);
  CHECK(upstream.count(bhttp::field::content_length) == 0);  // a bodiless GET, as Beast frames it

  parsed_request huge("GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: " +
                      std::string(dplb::http::max_forwarding_header_bytes, 'a') + "\r\n\r\n");
  upstream_head head;
  CHECK_FALSE(prepare_upstream_request(huge.head, "/", "127.0.0.1", head));
}

TEST_CASE("a Connection header listing thousands of options is refused at once, not scanned per field",
          "[server][admission]") {
  // Thousands of options against thousands of fields would cost about a second of CPU per request if
  // every field were compared with every option.
  std::string wire = "GET / HTTP/1.1\r\nHost: x\r\nConnection: ";
  for (int i = 0; i < 8000; ++i) wire += "o" + std::to_string(i) + ",";
  wire += "\r\n";
  for (int i = 0; i < 4000; ++i) wire += "X-F" + std::to_string(i) + ": v\r\n";
  wire += "\r\n";
  const auto decision = admit_wire(wire);
  CHECK(decision.refusal_status == 400);
  CHECK(std::string(decision.refusal_message).find("Connection") != std::string::npos);

  // Up to the bound, stripping stays linear in the fields and everything named is stripped.
  std::string listed = "GET / HTTP/1.1\r\nHost: x\r\nConnection: ";
  for (std::size_t i = 0; i < dplb::http::connection_options::max_options; ++i) listed += "X-H" + std::to_string(i) + ",";
  listed += "\r\nX-H0: 1\r\nX-H31: 1\r\nX-Kept: 1\r\n\r\n";
  parsed_request request(listed);
  const auto upstream = upstream_request(request, "127.0.0.1");
  CHECK(upstream.count("X-H0") == 0);
  CHECK(upstream.count("X-H31") == 0);
  CHECK(upstream["X-Kept"] == "1");
}
