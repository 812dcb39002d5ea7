// The admin token's digest: SHA-256 as the standard defines it (FIPS 180-4's test vectors), and whole
// tokens only match, whatever their lengths.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "dplb/admin/token_digest.hpp"

namespace admin = dplb::admin;

namespace {

std::string hex(const admin::token_digest::bytes& digest) {
  std::string out;
  char two[3];
  for (const unsigned char b : digest) {
    std::snprintf(two, sizeof two, "%02x", b);
    out += two;
  }
  return out;
}

}  // namespace

TEST_CASE("the token digest is SHA-256", "[admin][token]") {
  CHECK(hex(admin::token_digest::sha256("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(admin::token_digest::sha256("")) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(admin::token_digest::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

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
