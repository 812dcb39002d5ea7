// SHA-256 as the standard defines it (FIPS 180-4's test vectors), and a digest comparison that is equality:
// what the tenants' API keys and the admin token are kept and compared as.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "dplb/support/sha256.hpp"

namespace support = dplb::support;

namespace {

std::string hex(const support::sha256_digest& digest) {
  std::string out;
  char two[3];
  for (const unsigned char b : digest) {
    std::snprintf(two, sizeof two, "%02x", b);
    out += two;
  }
  return out;
}

}  // namespace

TEST_CASE("sha256: FIPS 180-4's examples", "[support][tenants]") {
  CHECK(hex(support::sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(support::sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(support::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_CASE("sha256: two digests are the same when every byte is", "[support][tenants]") {
  const auto abc = support::sha256("abc");
  CHECK(support::same_digest(abc, support::sha256("abc")));
  CHECK_FALSE(support::same_digest(abc, support::sha256("abd")));
  auto last_differs = abc;
  last_differs.back() ^= 1;
  CHECK_FALSE(support::same_digest(abc, last_differs));
}
