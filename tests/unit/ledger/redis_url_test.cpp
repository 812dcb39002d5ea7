#include "dplb/ledger/redis_url.hpp"

#include <catch2/catch.hpp>

#include <string>

using dplb::ledger::parse_redis_url;
using dplb::ledger::redis_url_error;

namespace {

// The message of the error a URL is refused with ("" if it is accepted).
std::string refusal(const std::string& url) {
  try {
    parse_redis_url(url);
  } catch (const redis_url_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a redis:// URL gives the host, the port, the credentials and the database", "[ledger]") {
  const auto plain = parse_redis_url("redis://127.0.0.1:6380");
  CHECK(plain.host == "127.0.0.1");
  CHECK(plain.port == 6380);
  CHECK(plain.user.empty());
  CHECK(plain.password.empty());
  CHECK(plain.db == 0);

  const auto full = parse_redis_url("redis://dplb:p%40ss@redis.example:7000/3");
  CHECK(full.host == "redis.example");
  CHECK(full.port == 7000);
  CHECK(full.user == "dplb");
  CHECK(full.password == "p@ss");  // percent-decoded
  CHECK(full.db == 3);

  const auto password_only = parse_redis_url("redis://:secret@[::1]:6379/");
  CHECK(password_only.host == "::1");
  CHECK(password_only.user.empty());
  CHECK(password_only.password == "secret");
  CHECK(password_only.db == 0);

  CHECK(parse_redis_url("redis://localhost").port == 6379);
}

TEST_CASE("a password given apart overrides the URL's", "[ledger]") {
  CHECK(parse_redis_url("redis://u:from-url@h:1", "from-file").password == "from-file");
  CHECK(parse_redis_url("redis://h:1", "from-file").password == "from-file");
  CHECK(parse_redis_url("redis://u:from-url@h:1", "").password == "from-url");
}

TEST_CASE("a URL that is not redis:// is refused naming --shared-state, never showing the password",
          "[ledger]") {
  for (const std::string url : {"rediss://u:hunter2@h:6379", "http://u:hunter2@h:6379", "redis://u:hunter2@h:notaport",
                                "redis://u:hunter2@h:70000", "redis://u:hunter2@h:6379/zero",
                                "redis://u:hunter2@h:6379/0?x=1", "redis://u:hunter2@:6379", "hunter2"}) {
    INFO(url);
    const auto message = refusal(url);
    CHECK(message.find("--shared-state") != std::string::npos);
    CHECK(message.find("hunter2") == std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("a URL is shown without its password, whatever it holds", "[ledger]") {
  using dplb::ledger::redacted_url;
  using dplb::ledger::shown_endpoint;
  CHECK(redacted_url("redis://dplb:s3cret@redis:6379/2") == "redis://dplb:***@redis:6379/2");
  CHECK(redacted_url("redis://:s3cret@redis:6379") == "redis://:***@redis:6379");
  // An '@' of the password's own, not percent-encoded: none of it shows.
  CHECK(redacted_url("http://admin:p@ss@h:1") == "http://admin:***@h:1");
  // No colon: what stands before the '@' may be a password.
  CHECK(redacted_url("redis://s3cret@redis:6379") == "redis://***@redis:6379");
  CHECK(redacted_url("redis://redis:6379") == "redis://redis:6379");
  CHECK(shown_endpoint(parse_redis_url("redis://dplb:s3cret@redis:6380/3")) == "redis://dplb@redis:6380/3");
}
