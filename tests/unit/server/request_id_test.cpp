// A two-leg request's X-Request-Id: the client's first one kept (empty too), or a fresh version-4 UUID.

#include <catch2/catch.hpp>

#include <regex>
#include <set>
#include <string>

#include "../../../src/server/request_id.hpp"

using dplb::server::first_request_id;
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

TEST_CASE("request id: the client's first X-Request-Id, whatever its case, even empty", "[server][pd]") {
  dplb::http::field_list fields;
  CHECK_FALSE(first_request_id(fields));
  fields.add(boost::beast::http::field::unknown, "x-REQUEST-id", "abc");
  fields.add(boost::beast::http::field::unknown, "X-Request-Id", "second");
  CHECK(first_request_id(fields) == std::optional<std::string>("abc"));
  dplb::http::field_list empty;
  empty.add(boost::beast::http::field::unknown, "X-Request-Id", "");
  CHECK(first_request_id(empty) == std::optional<std::string>(""));
}
