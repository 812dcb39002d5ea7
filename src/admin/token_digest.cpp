#include "dplb/admin/token_digest.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <stdexcept>

namespace dplb::admin {

token_digest::bytes token_digest::sha256(std::string_view text) {
  bytes out{};
  unsigned int written = 0;
  if (EVP_Digest(text.data(), text.size(), out.data(), &written, EVP_sha256(), nullptr) != 1 || written != size) {
    throw std::runtime_error("OpenSSL's SHA-256 failed");
  }
  return out;
}

token_digest::token_digest(std::string_view token) : digest_(sha256(token)), empty_(token.empty()) {}

bool token_digest::matches(std::string_view given) const noexcept {
  if (empty_) return false;
  try {
    const bytes presented = sha256(given);
    // A plain == may stop at the first differing byte; CRYPTO_memcmp reads all of them whatever they hold.
    return CRYPTO_memcmp(presented.data(), digest_.data(), size) == 0;
  } catch (const std::exception&) {
    return false;
  }
}

bool same_token(std::string_view given, std::string_view token) noexcept {
  try {
    return token_digest(token).matches(given);
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace dplb::admin
