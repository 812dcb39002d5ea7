// The X-Request-Id dplb sends the engines: the client's first one with a random suffix, or a fresh version-4 UUID for
// a request in two legs that came without one.

#include <catch2/catch.hpp>

#include <regex>
#include <set>
#include <string>

#include "../../../src/server/request_id.hpp"

using dplb::server::new_request_id;

TEST_CASE("request id: dplb's are version-4 UUIDs, never the same twice", "[server][pd]") {
  const std::regex uuid4("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const auto id = new_request_id();
    INFO(id);
    CHECK(std::regex_match(id, uuid4));
    seen.insert(id);
  }
  CHECK(seen.size() == 1000);
}

TEST_CASE("request id: the client's first X-Request-Id, whatever its case, unless empty or hop-by-hop",
          "[server][pd]") {
  using dplb::server::forwarded_request_id;
  namespace bhttp = boost::beast::http;
  dplb::http::field_list fields;
  CHECK_FALSE(forwarded_request_id(fields));
  fields.add(bhttp::field::unknown, "x-REQUEST-id", "abc");
  fields.add(bhttp::field::unknown, "X-Request-Id", "second");
  CHECK(forwarded_request_id(fields) == std::optional<std::string>("abc"));
  dplb::http::field_list empty;
  empty.add(bhttp::field::unknown, "X-Request-Id", "");
  CHECK_FALSE(forwarded_request_id(empty));
  dplb::http::field_list hop;
  hop.add(bhttp::field::connection, "Connection", "x-request-id");
  hop.add(bhttp::field::unknown, "X-Request-Id", "stripped");
  CHECK_FALSE(forwarded_request_id(hop));
}

TEST_CASE("request id: dplb's replaces every X-Request-Id line of the engine's head", "[server][pd]") {
  std::string head = "POST /v1/completions HTTP/1.1\r\nA: 1\r\nx-request-id: \r\nB: 2\r\nX-REQUEST-ID: old\r\n";
  const auto fields_from = head.find("\r\n") + 2;
  dplb::server::replace_request_id(head, fields_from, "new-id");
  CHECK(head == "POST /v1/completions HTTP/1.1\r\nA: 1\r\nB: 2\r\nX-Request-Id: new-id\r\n");
}

TEST_CASE("request id: a client's id reaches the engines with a random suffix, never the same twice", "[server][pd]") {
  const std::regex suffixed("^client-7-[0-9a-f]{16}$");
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const auto id = dplb::server::engine_request_id("client-7");
    INFO(id);
    CHECK(std::regex_match(id, suffixed));
    seen.insert(id);
  }
  CHECK(seen.size() == 1000);
}

TEST_CASE("request id: the engines get the client's made unique, one dplb makes for two legs, or none", "[server][pd]") {
  namespace bhttp = boost::beast::http;
  using dplb::server::assign_request_ids;
  const std::string request_line = "POST /v1/completions HTTP/1.1\r\n";
  dplb::server::request_ids ids;
  dplb::http::field_list given;
  given.add(bhttp::field::unknown, "X-Request-Id", "mine");
  for (const bool two_legs : {false, true}) {
    std::string head = request_line + "X-Request-Id: mine\r\n";
    assign_request_ids(given, two_legs, head, request_line.size(), ids);
    CHECK(ids.client == "mine");
    CHECK(ids.engine.starts_with("mine-"));
    CHECK(head == request_line + "X-Request-Id: " + ids.engine + "\r\n");
  }
  const dplb::http::field_list none;
  std::string head = request_line + "A: 1\r\n";
  assign_request_ids(none, false, head, request_line.size(), ids);
  CHECK(ids.client.empty());
  CHECK(ids.engine.empty());
  CHECK(head == request_line + "A: 1\r\n");  // a one-leg request without an id goes as it came
  assign_request_ids(none, true, head, request_line.size(), ids);
  CHECK(ids.client.empty());
  CHECK(ids.engine.size() == 36);
  CHECK(head == request_line + "A: 1\r\nX-Request-Id: " + ids.engine + "\r\n");
}
