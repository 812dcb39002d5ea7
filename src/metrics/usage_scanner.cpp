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
  const char* end = p + bytes.size();
  while (p < end) {
    if (state_ == state::scan) {
      // Fast path: nearly every byte of a response is outside a key of interest. Jump from quote to
      // quote, and past every quote whose next byte (when already here) cannot start either key; an SSE
      // event holds some thirty quotes and only the usage chunk has a key that matters.
      for (;;) {
        const void* quote = std::memchr(p, '"', static_cast<std::size_t>(end - p));
        if (!quote) return;
        p = static_cast<const char*>(quote);
        if (p + 1 == end || p[1] == 'p' || p[1] == 'c') break;
        p += p[1] == '"' ? 1 : 2;  // neither key starts here; a quote right after may open one
      }
    }
    step(*p++);
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
