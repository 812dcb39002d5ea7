#pragma once
// The admin token as dplb keeps it: its SHA-256 digest, never the token itself. A presented token is
// digested too and the two digests are compared in constant time (support/sha256.hpp), so the time a check
// takes depends neither on where a guess first differs from the token nor on the token's length (the digests
// always have 32 bytes).

#include <cstddef>
#include <string_view>

#include "dplb/support/sha256.hpp"

namespace dplb::admin {

class token_digest {
 public:
  static constexpr std::size_t size = support::sha256_size;
  using bytes = support::sha256_digest;

  // An empty token matches nothing (settings refuse an admin listener without a token).
  explicit token_digest(std::string_view token);

  // Whether `given` is the token: SHA-256(given) against the kept digest, in constant time.
  bool matches(std::string_view given) const noexcept;

 private:
  bytes digest_{};
  bool empty_ = true;
};

// Whether `given` equals `token`, by their digests (see token_digest): the admin API's one comparison.
bool same_token(std::string_view given, std::string_view token) noexcept;

}  // namespace dplb::admin
