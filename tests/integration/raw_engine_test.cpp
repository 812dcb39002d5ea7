// The raw engine and the raw response splitter on their own, without dplb: the conformance tests
// (http_conformance_test.cpp) can only be as exact as these are.

#include <catch2/catch.hpp>

#include "http_client.hpp"
#include "raw_engine.hpp"

using namespace dplb::test;
using namespace std::chrono_literals;

namespace {

std::string ok_response(std::string_view body) {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

}  // namespace

TEST_CASE("raw engine: pipelined requests are recorded whole, a chunked one with its trailers", "[raw_engine]") {
  raw_engine engine([](const raw_request& r) {
    return std::vector{write_bytes("HTTP/1.1 103 Early Hints\r\n\r\n"), write_bytes(ok_response(r.target()))};
  });
  http_connection client(engine.port());
  client.write_raw(
      "POST /a HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-T: v\r\n\r\n"
      "POST /b HTTP/1.1\r\nHost: e\r\nContent-Length: 3\r\n\r\nxyz");
  const auto reply = client.read_responses(2, 3s);
  CHECK(reply.responses.size() == 4);
  CHECK(reply.has_interim());
  const auto finals = reply.final_responses();
  REQUIRE(finals.size() == 2);
  CHECK(finals[0].body == "/a");
  CHECK(finals[1].body == "/b");

  REQUIRE(engine.await_requests(2, 3s));
  const auto requests = engine.requests();
  CHECK(requests[0].method() == "POST");
  CHECK(requests[0].target() == "/a");
  CHECK(requests[0].chunked);
  CHECK(requests[0].body == "abcde");
  CHECK(requests[0].trailers == "X-T: v\r\n");
  CHECK(requests[0].header("host") == "e");
  CHECK(requests[0].index_on_connection == 0);
  CHECK(requests[1].target() == "/b");
  CHECK(requests[1].body == "xyz");
  CHECK(requests[1].index_on_connection == 1);
  CHECK(requests[1].connection == 0);

  CHECK_FALSE(engine.peer_closed_at(0));
  client.close();
  CHECK(engine.await_peer_close(0, 3s));
  CHECK(engine.unfinished_bytes(0).empty());
}

TEST_CASE("raw engine: scripted close, reset and pause, connections counted in accept order", "[raw_engine]") {
  raw_engine engine([](const raw_request& r) -> std::vector<raw_action> {
    if (r.target() == "/eof") return {write_bytes("HTTP/1.1 200 OK\r\n\r\nuntil-close"), close_connection()};
    if (r.target() == "/reset") return {reset_connection()};
    return {pause_for(200ms), write_bytes(ok_response("late"))};
  });
  SECTION("close: the body ends with the connection, and it is not the peer's close") {
    http_connection client(engine.port());
    client.write_raw("GET /eof HTTP/1.1\r\nHost: e\r\n\r\n");
    const auto reply = client.read_responses(1, 3s);
    CHECK(reply.closed);
    const auto finals = reply.final_responses();
    REQUIRE(finals.size() == 1);
    CHECK(finals[0].close_delimited);
    CHECK(finals[0].body == "until-close");
    CHECK_FALSE(engine.peer_closed_at(0));
  }
  SECTION("reset: the connection ends with nothing sent") {
    http_connection client(engine.port());
    client.write_raw("GET /reset HTTP/1.1\r\nHost: e\r\n\r\n");
    const auto reply = client.read_to_close(3s);
    CHECK(reply.closed);
    CHECK(reply.bytes.empty());
  }
  SECTION("pause: the answer leaves no earlier than scripted; a partial request is kept when the peer leaves") {
    http_connection client(engine.port());
    const auto t0 = steady::now();
    client.write_raw("GET /late HTTP/1.1\r\nHost: e\r\n\r\n");
    const auto reply = client.read_responses(1, 3s);
    CHECK(steady::now() - t0 >= 190ms);
    REQUIRE(reply.final_responses().size() == 1);
    CHECK(reply.final_responses()[0].body == "late");
    client.write_raw("GET /never-fin");
    client.close();
    CHECK(engine.await_peer_close(0, 3s));
    CHECK(engine.unfinished_bytes(0) == "GET /never-fin");
  }
  SECTION("connections are numbered in accept order") {
    http_connection first(engine.port());
    REQUIRE(engine.await_accepted(1, 3s));
    http_connection second(engine.port());
    REQUIRE(engine.await_accepted(2, 3s));
    second.write_raw("GET /reset HTTP/1.1\r\nHost: e\r\n\r\n");
    REQUIRE(engine.await_requests(1, 3s));
    CHECK(engine.requests()[0].connection == 1);
    CHECK(engine.accepted_count() == 2);
  }
}

TEST_CASE("raw engine: split_responses follows framing, interim responses, HEAD, and leaves what follows", "[raw_engine]") {
  const std::string bytes =
      "HTTP/1.1 100 Continue\r\n\r\n"
      "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"  // answers a HEAD
      "HTTP/1.1 204 No Content\r\n\r\n"
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;e=1\r\nab\r\n1\r\nc\r\n0\r\nT: x\r\n\r\n"
      "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
      "GARBAGE";
  const auto split = split_responses(bytes, {true});
  REQUIRE(split.responses.size() == 6);
  CHECK(split.responses[0].interim());
  CHECK(split.responses[1].status == 200);
  CHECK(split.responses[1].body.empty());
  CHECK(split.responses[1].header("content-length") == "100");
  CHECK(split.responses[2].status == 204);
  CHECK(split.responses[3].chunked);
  CHECK(split.responses[3].body == "abc");
  CHECK(split.responses[4].status == 304);
  CHECK(split.responses[4].body.empty());
  CHECK(split.responses[5].body == "ok");
  for (const auto& r : split.responses) CHECK(r.complete);
  CHECK(bytes.substr(split.consumed) == "GARBAGE");

  const std::string until_close = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello";
  CHECK_FALSE(split_responses(until_close).responses.at(0).complete);
  const auto closed = split_responses(until_close, {}, true);
  CHECK(closed.responses.at(0).complete);
  CHECK(closed.responses.at(0).close_delimited);
  CHECK(closed.responses.at(0).body == "hello");

  const auto partial = split_responses("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel");
  REQUIRE(partial.responses.size() == 1);
  CHECK_FALSE(partial.responses[0].complete);
  CHECK(partial.consumed == 0);
}
