#include "dplb/admin/token_digest.hpp"

#include <exception>

namespace dplb::admin {

token_digest::token_digest(std::string_view token) : digest_(support::sha256(token)), empty_(token.empty()) {}

bool token_digest::matches(std::string_view given) const noexcept {
  if (empty_) return false;
  try {
    return support::same_digest(support::sha256(given), digest_);
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
