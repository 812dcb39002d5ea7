#include "dplb/support/sha256.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <stdexcept>

namespace dplb::support {

sha256_digest sha256(std::string_view text) {
  sha256_digest out{};
  unsigned int written = 0;
  if (EVP_Digest(text.data(), text.size(), out.data(), &written, EVP_sha256(), nullptr) != 1 ||
      written != sha256_size) {
    throw std::runtime_error("OpenSSL's SHA-256 failed");
  }
  return out;
}

bool same_digest(const sha256_digest& a, const sha256_digest& b) noexcept {
  // A plain == may stop at the first differing byte; CRYPTO_memcmp reads all of them whatever they hold.
  return CRYPTO_memcmp(a.data(), b.data(), sha256_size) == 0;
}

}  // namespace dplb::support
