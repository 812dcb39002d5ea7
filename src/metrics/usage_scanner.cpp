#include "dplb/metrics/usage_scanner.hpp"

#include <cstring>
#include <limits>

namespace dplb::metrics {

namespace {
constexpr std::string_view prompt_key = "prompt_tokens";
constexpr std::string_view completion_key = "completion_tokens";
constexpr std::uint64_t max_value = std::numeric_limits<std::uint64_t>::max() / 10 - 10;

bool is_space(char c) noexcept { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
}  // namespace

void usage_scanner::feed(std::string_view bytes) noexcept {
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  // `"completion_tokens"`, the longer key with its quotes, fits in what is left of the piece.
  constexpr std::size_t whole_key = completion_key.size() + 2;
  const auto key_at = [](const char* quote, std::string_view key) {
    return std::memcmp(quote + 1, key.data(), key.size()) == 0 && quote[1 + key.size()] == '"';
  };
  while (p < end) {
    if (state_ != state::scan) {
      step(*p++);
      continue;
    }
    // Nearly every byte of a response is outside a key of interest: jump to the next quote.
    const void* quote = std::memchr(p, '"', static_cast<std::size_t>(end - p));
    if (!quote) return;
    p = static_cast<const char*>(quote);
    if (static_cast<std::size_t>(end - p) >= whole_key) {
      // The whole key is in this piece: compare it at once (an SSE event holds some thirty quotes).
      if (p[1] == 'p' && key_at(p, prompt_key)) {
        key_ = which::prompt;
        state_ = state::before_colon;
        p += prompt_key.size() + 2;
      } else if (p[1] == 'c' && key_at(p, completion_key)) {
        key_ = which::completion;
        state_ = state::before_colon;
        p += completion_key.size() + 2;
      } else {
        ++p;  // no key of interest opens here; a quote inside is found by the next search
      }
      continue;
    }
    step(*p++);  // near the end of the piece: byte by byte, so that a key split across pieces is found
  }
}

void usage_scanner::restart_with(char c) noexcept {
  state_ = state::scan;
  if (c == '"') step(c);
}

void usage_scanner::step(char c) noexcept {
  switch (state_) {
    case state::scan:
      if (c == '"') {
        state_ = state::key;
        matched_ = 0;
      }
      return;
    case state::key: {
      if (matched_ == 0) {
        if (c == 'p') key_ = which::prompt;
        else if (c == 'c') key_ = which::completion;
        else return restart_with(c);
        matched_ = 1;
        return;
      }
      const auto key = key_ == which::prompt ? prompt_key : completion_key;
      if (matched_ < key.size()) {
        if (c != key[matched_]) return restart_with(c);
        ++matched_;
        return;
      }
      if (c != '"') return restart_with(c);
      state_ = state::before_colon;
      return;
    }
    case state::before_colon:
      if (is_space(c)) return;
      if (c != ':') return restart_with(c);
      state_ = state::before_value;
      return;
    case state::before_value:
      if (is_space(c)) return;
      if (c < '0' || c > '9') return restart_with(c);
      value_ = static_cast<std::uint64_t>(c - '0');
      state_ = state::number;
      return;
    case state::number:
      if (c >= '0' && c <= '9') {
        if (value_ < max_value) value_ = value_ * 10 + static_cast<std::uint64_t>(c - '0');
        return;
      }
      (key_ == which::prompt ? prompt_ : completion_) = value_;
      return restart_with(c);
  }
}

}  // namespace dplb::metrics
