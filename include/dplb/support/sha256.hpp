#pragma once
// SHA-256 of a text, and a comparison of two digests that takes the same time whatever they hold (OpenSSL's
// CRYPTO_memcmp): what keys and tokens are kept and compared as, by the tenants' API keys and the admin
// token alike, so that neither keeps a secret as text.

#include <array>
#include <cstddef>
#include <string_view>

namespace dplb::support {

inline constexpr std::size_t sha256_size = 32;
using sha256_digest = std::array<unsigned char, sha256_size>;

// SHA-256 of `text`. OpenSSL's digest of memory fails only with a broken library: then this throws
// std::runtime_error.
sha256_digest sha256(std::string_view text);

// Whether the digests are equal, reading every byte of both whatever they hold: the time it takes tells
// nothing of where they first differ.
bool same_digest(const sha256_digest& a, const sha256_digest& b) noexcept;

}  // namespace dplb::support
