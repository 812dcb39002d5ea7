// The admin token's digest: whole tokens only match, whatever their lengths (the digest itself is
// support::sha256, tested in tests/unit/support/sha256_test.cpp).
#include <catch2/catch.hpp>

#include <string>

#include "dplb/admin/token_digest.hpp"

namespace admin = dplb::admin;

TEST_CASE("a token digest matches the whole token only", "[admin][token]") {
  const admin::token_digest digest("abc");
  CHECK(digest.matches("abc"));
  CHECK_FALSE(digest.matches("abd"));
  CHECK_FALSE(digest.matches("ab"));
  CHECK_FALSE(digest.matches("abcabc"));  // the token repeated is not the token
  CHECK_FALSE(digest.matches("abc "));
  CHECK_FALSE(digest.matches(""));
  CHECK_FALSE(digest.matches(std::string("abc\0", 4)));  // an embedded NUL counts
  CHECK_FALSE(admin::token_digest("").matches(""));      // an empty token never authenticates
  CHECK(admin::same_token("abc", "abc"));
  CHECK_FALSE(admin::same_token("abd", "abc"));
  CHECK_FALSE(admin::same_token("", ""));
}
