// dplb on the HTTP failure surface: the real dplb in front of an engine that writes exactly the bytes a
// test scripts (tests/support/raw_engine.hpp). The answers are valid but unusual HTTP, or broken in ways
// an engine can really break; whatever the engine does, a client must get a correctly framed answer that
// is its own, and dplb must never reuse an engine connection whose state it cannot be sure of.

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "http_client.hpp"
#include "processes.hpp"
#include "raw_engine.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Long enough for any answer on a busy machine, short enough that a client left hanging fails fast (the
// client and the raw engine scale it by the timing slack).
std::chrono::milliseconds answer_deadline() { return std::chrono::milliseconds(3000); }

// One worker thread, so that every request meets the same upstream connection pool; no health checks,
// so that every request the raw engine sees was proxied.
std::vector<std::string> proxy_options() { return {"--threads", "1", "--health-check-interval-ms", "0"}; }

std::string ok_response(std::string_view body) {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

std::string get(std::string_view target) { return "GET " + std::string(target) + " HTTP/1.1\r\nHost: dplb\r\n\r\n"; }

// The request target without its leading '/': the body of the engine's usual answer, so that every
// client can tell its own answer from anyone else's.
std::string target_name(const raw_request& request) { return std::string(request.target().substr(1)); }

std::vector<raw_action> echo_target(const raw_request& request) {
  return {write_bytes(ok_response(target_name(request)))};
}

std::string chunk_size_line(std::size_t size) {
  char line[32];
  std::snprintf(line, sizeof line, "%zx\r\n", size);
  return line;
}

std::optional<raw_request> request_for(const raw_engine& engine, std::string_view target) {
  for (auto& r : engine.requests()) {
    if (r.target() == target) return r;
  }
  return std::nullopt;
}

// The one final response a read got; an empty one (status 0) when it got none or several.
raw_response sole_final(const raw_reply& reply) {
  auto finals = reply.final_responses();
  return finals.size() == 1 ? finals.front() : raw_response{};
}

// A 1xx status line anywhere in what the client received.
bool has_interim_bytes(std::string_view bytes) {
  for (auto at = bytes.find("HTTP/1."); at != std::string_view::npos; at = bytes.find("HTTP/1.", at + 1)) {
    if (bytes.substr(at + 8, 3).starts_with(" 1")) return true;
  }
  return false;
}

bool is_openai_error(const std::string& body, unsigned status) {
  const auto parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded() || !parsed.contains("error")) return false;
  const auto& error = parsed["error"];
  return error.contains("message") && error["message"].is_string() && !error["message"].get<std::string>().empty() &&
         error.contains("type") && error["type"].is_string() && error.contains("code") && error["code"] == status;
}

std::string printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string describe(const raw_reply& reply) {
  return std::string(reply.deadline_passed ? "[deadline passed] " : "") + (reply.closed ? "[closed] " : "") +
         "\"" + printable(reply.bytes) + "\"";
}

double keepalive_retries(std::uint16_t proxy_port) {
  return metric_sum(scrape_metrics(proxy_port), "dplb_upstream_keepalive_retries_total");
}

// A loopback port that refuses connections: bound to learn a free number, then closed.
std::uint16_t refusing_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot bind a loopback port");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

// Sends `bad_target` (which the engine answers with something dplb must refuse) and requires a 502 in
// OpenAI's shape; then requires the next request, /r2, to be answered on a new engine connection. Returns
// the refused answer's raw bytes for further checks.
std::string expect_502_and_a_fresh_connection_after(const raw_engine& engine, const dplb_proxy& proxy,
                                                    std::string_view bad_target) {
  std::string refused_bytes;
  {
    http_connection client(proxy.port());
    client.write_raw(get(bad_target));
    const auto reply = client.read_responses(1, answer_deadline());
    INFO("answer: " << describe(reply));
    CHECK(sole_final(reply).status == 502);
    CHECK(is_openai_error(sole_final(reply).body, 502));
    refused_bytes = reply.bytes;
  }
  http_connection next_client(proxy.port());
  next_client.write_raw(get("/r2"));
  const auto next = next_client.read_responses(1, answer_deadline());
  INFO("next answer: " << describe(next));
  CHECK(sole_final(next).body == "r2");
  const auto refused = request_for(engine, bad_target);
  const auto after = request_for(engine, "/r2");
  REQUIRE(refused);
  REQUIRE(after);
  CHECK(after->connection != refused->connection);
  return refused_bytes;
}

}  // namespace

TEST_CASE("conformance: interim responses from the engine are dropped, the client gets only the final one", "[conformance]") {
  const auto [name, interim_bytes] = GENERATE(table<std::string, std::string>({
      {"103 Early Hints", "HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"},
      {"100 Continue", "HTTP/1.1 100 Continue\r\n\r\n"},
      {"two in a row", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"},
  }));
  INFO(name);
  const std::string interim = interim_bytes;
  raw_engine engine([&](const raw_request& r) {
    if (r.target() == "/r1") return std::vector{write_bytes(interim + ok_response("r1"))};
    return echo_target(r);
  });
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());

  client.write_raw(get("/r1"));
  const auto first = client.read_responses(1, answer_deadline());
  INFO("first answer: " << describe(first));
  CHECK_FALSE(has_interim_bytes(first.bytes));
  CHECK(first.responses.size() == 1);
  CHECK(sole_final(first).status == 200);
  CHECK(sole_final(first).body == "r1");

  client.write_raw(get("/r2"));
  const auto second = client.read_responses(1, answer_deadline());
  INFO("second answer: " << describe(second));
  CHECK(sole_final(second).status == 200);
  CHECK(sole_final(second).body == "r2");
}

TEST_CASE("conformance: a 101 nobody asked for is a 502, and its engine connection is never reused", "[conformance]") {
  raw_engine engine([](const raw_request& r) {
    if (r.target() == "/upgrade") {
      return std::vector{write_bytes("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")};
    }
    return echo_target(r);
  });
  dplb_proxy proxy({engine.url()}, proxy_options());
  expect_502_and_a_fresh_connection_after(engine, proxy, "/upgrade");
}

TEST_CASE("conformance: bytes after a response's end make its engine connection unusable", "[conformance]") {
  SECTION("in the same write as the body") {
    raw_engine engine([](const raw_request& r) {
      if (r.target() == "/r1") return std::vector{write_bytes("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nr1GARBAGE")};
      return echo_target(r);
    });
    dplb_proxy proxy({engine.url()}, proxy_options());
    http_connection client(proxy.port());
    client.write_raw(get("/r1"));
    const auto first = client.read_responses(1, answer_deadline());
    INFO("first answer: " << describe(first));
    CHECK(sole_final(first).status == 200);
    CHECK(sole_final(first).body == "r1");
    client.write_raw(get("/r2"));
    const auto second = client.read_responses(1, answer_deadline());
    INFO("second answer: " << describe(second));
    CHECK(sole_final(second).status == 200);
    CHECK(sole_final(second).body == "r2");
    const auto dirty = request_for(engine, "/r1");
    const auto after = request_for(engine, "/r2");
    REQUIRE(dirty);
    REQUIRE(after);
    CHECK(after->connection != dirty->connection);
  }
  SECTION("a stale complete response on the idle pooled connection") {
    raw_engine engine([](const raw_request& r) {
      if (r.target() == "/r1") {
        return std::vector{write_bytes(ok_response("r1")), pause_for(100ms),
                           write_bytes("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")};
      }
      return echo_target(r);
    });
    dplb_proxy proxy({engine.url()}, proxy_options());
    http_connection client(proxy.port());
    client.write_raw(get("/r1"));
    const auto first = client.read_responses(1, answer_deadline());
    INFO("first answer: " << describe(first));
    CHECK(sole_final(first).body == "r1");
    const auto dirty = request_for(engine, "/r1");
    REQUIRE(dirty);
    // Closed by the pool's sweep (a quarter of --upstream-idle-timeout-ms: 1 s) if not taken first.
    CHECK(engine.await_peer_close(dirty->connection, answer_deadline()));
    client.write_raw(get("/r2"));
    const auto second = client.read_responses(1, answer_deadline());
    INFO("second answer: " << describe(second));
    CHECK(sole_final(second).status == 200);
    CHECK(sole_final(second).body == "r2");
  }
}

TEST_CASE("conformance: a body delimited by the engine closing reaches the client whole, with no keep-alive re-send", "[conformance]") {
  raw_engine engine([](const raw_request& r) {
    return std::vector{write_bytes("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + target_name(r)), close_connection()};
  });
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  SECTION("HTTP/1.1 client: re-framed chunked, and the client connection stays usable") {
    client.write_raw(get("/hello"));
    const auto first = client.read_responses(1, answer_deadline());
    INFO("first answer: " << describe(first));
    CHECK(sole_final(first).status == 200);
    CHECK(sole_final(first).chunked);
    CHECK(sole_final(first).body == "hello");
    CHECK_FALSE(first.closed);
    client.write_raw(get("/world"));
    const auto second = client.read_responses(1, answer_deadline());
    INFO("second answer: " << describe(second));
    CHECK(sole_final(second).body == "world");
    CHECK(keepalive_retries(proxy.port()) == 0);
    CHECK(engine.request_count() == 2);
  }
  SECTION("HTTP/1.0 client: delimited by dplb closing the connection") {
    client.write_raw("GET /hello HTTP/1.0\r\n\r\n");
    const auto reply = client.read_responses(1, answer_deadline());
    INFO("answer: " << describe(reply));
    CHECK(sole_final(reply).status == 200);
    CHECK(sole_final(reply).close_delimited);
    CHECK(sole_final(reply).body == "hello");
    CHECK(reply.closed);
  }
}

TEST_CASE("conformance: framing comes from the parser, never from a header the engine's Connection names away", "[conformance]") {
  const auto [name, answer_bytes] = GENERATE(table<std::string, std::string>({
      {"Connection: Content-Length", "HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello"},
      {"Connection: Transfer-Encoding",
       "HTTP/1.1 200 OK\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
  }));
  INFO(name);
  const std::string answer = answer_bytes;
  raw_engine engine([&](const raw_request& r) {
    if (r.target() == "/hello") return std::vector{write_bytes(answer)};
    return echo_target(r);
  });
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  client.write_raw(get("/hello"));
  const auto first = client.read_responses(1, answer_deadline());
  INFO("first answer: " << describe(first));
  CHECK(sole_final(first).status == 200);
  CHECK(sole_final(first).body == "hello");
  CHECK_FALSE(sole_final(first).close_delimited);
  CHECK_FALSE(first.closed);
  client.write_raw(get("/r2"));
  const auto second = client.read_responses(1, answer_deadline());
  INFO("second answer: " << describe(second));
  CHECK(sole_final(second).body == "r2");
}

TEST_CASE("conformance: responses without a body leave client and engine connections in step", "[conformance]") {
  const auto [name, request_bytes, answer_bytes, answers_head, status] =
      GENERATE(table<std::string, std::string, std::string, bool, unsigned>({
          {"HEAD answered with Content-Length: 100", "HEAD /nobody HTTP/1.1\r\nHost: dplb\r\n\r\n",
           "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", true, 200},
          {"204", get("/nobody"), "HTTP/1.1 204 No Content\r\n\r\n", false, 204},
          {"304", get("/nobody"), "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n", false, 304},
          {"304 with Content-Length", get("/nobody"),
           "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 5\r\n\r\n", false, 304},
      }));
  INFO(name);
  const std::string answer = answer_bytes;
  raw_engine engine([&](const raw_request& r) {
    if (r.target() == "/nobody") return std::vector{write_bytes(answer)};
    return echo_target(r);
  });
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  client.write_raw(request_bytes);
  const auto first = client.read_responses(1, answer_deadline(), {answers_head});
  INFO("first answer: " << describe(first));
  CHECK(sole_final(first).status == status);
  CHECK(sole_final(first).body.empty());
  client.write_raw(get("/r2"));
  const auto second = client.read_responses(1, answer_deadline());
  INFO("second answer: " << describe(second));
  CHECK(sole_final(second).status == 200);
  CHECK(sole_final(second).body == "r2");
  const auto no_body = request_for(engine, "/nobody");
  const auto after = request_for(engine, "/r2");
  REQUIRE(no_body);
  REQUIRE(after);
  CHECK(after->connection == no_body->connection);  // still in step: reused
}

TEST_CASE("conformance: pipelined client requests are answered in order", "[conformance]") {
  raw_engine engine(echo_target);
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  client.write_raw(get("/p1") + get("/p2"));
  const auto reply = client.read_responses(2, answer_deadline());
  INFO("answers: " << describe(reply));
  const auto finals = reply.final_responses();
  REQUIRE(finals.size() == 2);
  CHECK(finals[0].body == "p1");
  CHECK(finals[1].body == "p2");
}

TEST_CASE("conformance: HTTP/1.0 clients get HTTP/1.0 semantics", "[conformance]") {
  raw_engine engine(echo_target);
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  SECTION("Expect: 100-continue gets no 100 Continue, only the final response") {
    client.write_raw("POST /expect HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello");
    const auto reply = client.read_responses(1, answer_deadline());
    INFO("answer: " << describe(reply));
    CHECK(reply.bytes.find("100 Continue") == std::string::npos);
    CHECK_FALSE(has_interim_bytes(reply.bytes));
    CHECK(sole_final(reply).status == 200);
    CHECK(sole_final(reply).body == "expect");
  }
  SECTION("without keep-alive, dplb closes after the response") {
    client.write_raw("GET /r1 HTTP/1.0\r\n\r\n");
    const auto reply = client.read_responses(1, answer_deadline());
    INFO("answer: " << describe(reply));
    CHECK(sole_final(reply).body == "r1");
    const auto rest = reply.closed ? reply : client.read_to_close(answer_deadline());
    INFO("after the answer: " << describe(rest));
    CHECK(rest.closed);
  }
  SECTION("with Connection: keep-alive, the response says keep-alive and the connection serves another") {
    client.write_raw("GET /r1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    const auto first = client.read_responses(1, answer_deadline());
    INFO("first answer: " << describe(first));
    CHECK(sole_final(first).body == "r1");
    const auto connection = sole_final(first).header("connection").value_or("");
    CHECK(connection.find("keep-alive") != std::string::npos);
    CHECK_FALSE(first.closed);
    client.write_raw("GET /r2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    const auto second = client.read_responses(1, answer_deadline());
    INFO("second answer: " << describe(second));
    CHECK(sole_final(second).body == "r2");
  }
}

TEST_CASE("conformance: Expect: 100-continue on HTTP/1.1 is answered by dplb and never forwarded", "[conformance]") {
  raw_engine engine(echo_target);
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  client.write_raw("POST /expect HTTP/1.1\r\nHost: dplb\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello");
  const auto reply = client.read_responses(1, answer_deadline());
  INFO("answer: " << describe(reply));
  REQUIRE(reply.responses.size() == 2);
  CHECK(reply.responses[0].raw == "HTTP/1.1 100 Continue\r\n\r\n");
  CHECK(sole_final(reply).status == 200);
  CHECK(sole_final(reply).body == "expect");
  const auto forwarded = request_for(engine, "/expect");
  REQUIRE(forwarded);
  CHECK_FALSE(forwarded->header("expect"));
  CHECK(forwarded->body == "hello");
}

TEST_CASE("conformance: Host is required once on HTTP/1.1 and optional on HTTP/1.0", "[conformance]") {
  raw_engine engine(echo_target);
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  SECTION("HTTP/1.1 without Host, or two Host headers, is a 400 that no engine sees") {
    const std::string head = GENERATE(as<std::string>{}, "GET /r1 HTTP/1.1\r\n\r\n",
                                      "GET /r1 HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n");
    client.write_raw(head);
    const auto reply = client.read_responses(1, answer_deadline());
    INFO("answer: " << describe(reply));
    CHECK(sole_final(reply).status == 400);
    CHECK(is_openai_error(sole_final(reply).body, 400));
    CHECK(engine.request_count() == 0);
  }
  SECTION("HTTP/1.0 without Host is proxied") {
    client.write_raw("GET /r1 HTTP/1.0\r\n\r\n");
    const auto reply = client.read_responses(1, answer_deadline());
    INFO("answer: " << describe(reply));
    CHECK(sole_final(reply).status == 200);
    CHECK(sole_final(reply).body == "r1");
    CHECK(engine.request_count() == 1);
  }
}

TEST_CASE("conformance: a bare CR or a NUL in an engine's header value is a 502, and the bytes never reach the client", "[conformance]") {
  const auto [name, bad_value] = GENERATE(table<std::string, std::string>({
      {"bare CR", "a\rb"},
      {"NUL", std::string("a\0b", 3)},
  }));
  INFO(name);
  const std::string value = bad_value;
  raw_engine engine([&](const raw_request& r) {
    if (r.target() == "/bad") return std::vector{write_bytes("HTTP/1.1 200 OK\r\nX-Bad: " + value + "\r\nContent-Length: 2\r\n\r\nr1")};
    return echo_target(r);
  });
  dplb_proxy proxy({engine.url()}, proxy_options());
  const auto refused_bytes = expect_502_and_a_fresh_connection_after(engine, proxy, "/bad");
  CHECK(refused_bytes.find(value) == std::string::npos);
}

TEST_CASE("conformance: a chunked request's trailers never reach the engine", "[conformance]") {
  raw_engine engine(echo_target);
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  client.write_raw("POST /trailer HTTP/1.1\r\nHost: dplb\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5\r\nhello\r\n0\r\nX-Trailer: evil\r\n\r\n");
  const auto reply = client.read_responses(1, answer_deadline());
  INFO("answer: " << describe(reply));
  CHECK(sole_final(reply).status == 200);
  const auto forwarded = request_for(engine, "/trailer");
  REQUIRE(forwarded);
  INFO("engine got: " << printable(forwarded->head));
  CHECK_FALSE(forwarded->chunked);
  CHECK(forwarded->header("content-length") == "5");
  CHECK(forwarded->body == "hello");
  CHECK(forwarded->trailers.empty());
  std::string head_lower = forwarded->head;
  std::transform(head_lower.begin(), head_lower.end(), head_lower.begin(), ::tolower);
  CHECK(head_lower.find("x-trailer") == std::string::npos);
  CHECK(head_lower.find("evil") == std::string::npos);
}

TEST_CASE("conformance: a request is re-sent on a fresh connection only in the keep-alive race", "[conformance]") {
  SECTION("the engine closes the pooled connection at once without answering: re-sent, once") {
    raw_engine engine([](const raw_request& r) {
      if (r.connection == 0 && r.index_on_connection == 1) return std::vector{close_connection()};
      return echo_target(r);
    });
    dplb_proxy proxy({engine.url()}, proxy_options());
    http_connection client(proxy.port());
    client.write_raw(get("/r1"));
    const auto first = client.read_responses(1, answer_deadline());
    INFO("first answer: " << describe(first));
    CHECK(sole_final(first).body == "r1");
    client.write_raw(get("/r2"));
    const auto second = client.read_responses(1, answer_deadline());
    INFO("second answer: " << describe(second));
    CHECK(sole_final(second).status == 200);
    CHECK(sole_final(second).body == "r2");
    CHECK(engine.request_count() == 3);
    CHECK(keepalive_retries(proxy.port()) == 1);
  }
  SECTION("the engine holds the request 1.5 s and then closes: it may be working on it, never re-sent") {
    raw_engine engine([](const raw_request& r) {
      if (r.connection == 0 && r.index_on_connection == 1) return std::vector{pause_for(1500ms), close_connection()};
      return echo_target(r);
    });
    dplb_proxy proxy({engine.url()}, proxy_options());
    http_connection client(proxy.port());
    client.write_raw(get("/r1"));
    const auto first = client.read_responses(1, answer_deadline());
    INFO("first answer: " << describe(first));
    CHECK(sole_final(first).body == "r1");
    client.write_raw(get("/r2"));
    const auto second = client.read_responses(1, answer_deadline() + 1500ms);
    INFO("second answer: " << describe(second));
    CHECK(sole_final(second).status == 502);
    CHECK(is_openai_error(sole_final(second).body, 502));
    CHECK(engine.request_count() == 2);
    CHECK(keepalive_retries(proxy.port()) == 0);
  }
}

TEST_CASE("conformance: every rank refusing connections is a 503 with Retry-After", "[conformance]") {
  const std::vector<std::string> backends{"http://127.0.0.1:" + std::to_string(refusing_port()),
                                          "http://127.0.0.1:" + std::to_string(refusing_port())};
  dplb_proxy proxy(backends, proxy_options());
  http_connection client(proxy.port());
  const std::string body = R"({"prompt":"x","max_tokens":1})";
  client.write_raw("POST /v1/completions HTTP/1.1\r\nHost: dplb\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  const auto reply = client.read_responses(1, answer_deadline());
  INFO("answer: " << describe(reply));
  CHECK(sole_final(reply).status == 503);
  CHECK(sole_final(reply).header("retry-after"));
  CHECK(is_openai_error(sole_final(reply).body, 503));
}

TEST_CASE("conformance: an engine mixing odd but valid answers on one connection never gives a client another's answer", "[conformance]") {
  // The answer's kind cycles with the id; kind 4 closes the connection, so the second round starts on a
  // new one and every kind follows every other on some connection.
  raw_engine engine([](const raw_request& r) {
    const auto id = std::string(r.target().substr(std::string_view("/mix/").size()));
    const std::string body = "id-" + id;
    switch (std::stoi(id) % 5) {
      case 0:
        return std::vector{write_bytes("HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n" + ok_response(body))};
      case 1:  // chunked, with a chunk extension and a trailer
        return std::vector{write_bytes("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nid-\r\n" +
                                       chunk_size_line(id.size()) + id + "\r\n0\r\nX-Engine-Trailer: t\r\n\r\n")};
      case 2:
        return std::vector{write_bytes("HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: " +
                                       std::to_string(body.size()) + "\r\n\r\n" + body)};
      case 3:  // an interim response, then the final one in two writes
        return std::vector{write_bytes("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
                           pause_for(20ms), write_bytes(chunk_size_line(body.size()) + body + "\r\n0\r\n\r\n")};
      default:
        return std::vector{write_bytes("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body), close_connection()};
    }
  });
  dplb_proxy proxy({engine.url()}, proxy_options());
  http_connection client(proxy.port());
  for (int id = 0; id < 10; ++id) {
    client.write_raw(get("/mix/" + std::to_string(id)));
    const auto reply = client.read_responses(1, answer_deadline());
    INFO("request " << id << " got: " << describe(reply));
    CHECK(sole_final(reply).status == 200);
    CHECK(sole_final(reply).body == "id-" + std::to_string(id));
  }
}
