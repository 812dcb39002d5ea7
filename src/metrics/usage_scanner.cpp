#include "dplb/metrics/usage_scanner.hpp"

#include <algorithm>
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
  if (counting_events_) count_events(bytes);
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  // `"completion_tokens"`, the longer key with its quotes: a key that starts this far from the end of the
  // piece is whole in it.
  constexpr std::size_t whole_key = completion_key.size() + 2;
  constexpr std::string_view suffix = "_tokens\"";  // what both keys end with
  // Where an opening quote may be: not in a key already read, nor in bytes the state machine consumed
  // (the closing quote of `"prompt_tokens"` opens nothing), nor in an earlier piece (a key that began there
  // is the state machine's, which carried it over).
  const char* floor = p;
  const auto key_before = [&](const char* at, std::string_view name) {
    return at - floor >= static_cast<std::ptrdiff_t>(name.size() + 1) &&
           at[-1 - static_cast<std::ptrdiff_t>(name.size())] == '"' &&
           std::memcmp(at - name.size(), name.data(), name.size()) == 0;
  };
  while (p < end) {
    if (state_ != state::scan) {
      step(*p++);
      floor = p;
      continue;
    }
    const char* const tail = end - std::min<std::size_t>(whole_key, static_cast<std::size_t>(end - bytes.data()));
    if (p < tail) {
      // Nearly every byte of a response is outside a key of interest: jump from underscore to underscore
      // (a JSON body holds some forty quotes and a few underscores) to the next `_tokens"`, which ends
      // both keys.
      const void* hit = std::memchr(p, '_', static_cast<std::size_t>(end - p));
      const char* const at = static_cast<const char*>(hit);
      if (!hit || at + suffix.size() > end) {
        p = std::max(p, tail);  // no whole key left: the tail goes byte by byte, for a key split across pieces
        continue;
      }
      const char* const after = at + suffix.size();
      if (std::memcmp(at, suffix.data(), suffix.size()) != 0) {
        p = at + 1;
        continue;
      }
      if (key_before(at, "prompt")) {
        key_ = which::prompt;
      } else if (key_before(at, "completion")) {
        key_ = which::completion;
      } else {
        p = at + 1;  // another name's end ("total_tokens"): its closing quote may still open a key
        continue;
      }
      // The key is read whole, closing quote included (even one that ends in the tail).
      state_ = state::before_colon;
      p = after;
      floor = p;
      continue;
    }
    // The tail, byte by byte from its first quote, so that a key split across pieces is found (in the scan
    // state the machine only ever reacts to a quote).
    const void* quote = std::memchr(p, '"', static_cast<std::size_t>(end - p));
    if (!quote) return;
    p = static_cast<const char*>(quote);
    step(*p++);
    floor = p;
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

// Byte by byte only at a line's start; the rest of a line is skipped to its newline at once.
void usage_scanner::count_events(std::string_view bytes) noexcept {
  constexpr std::string_view prefix = "data:";
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  while (p < end) {
    if (line_ == line::rest) {
      const void* newline = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
      if (!newline) return;
      p = static_cast<const char*>(newline) + 1;
      line_ = line::start;
      continue;
    }
    const char c = *p++;
    switch (line_) {
      case line::start:
      case line::prefix:
        if (line_ == line::start) prefix_matched_ = 0;
        if (c == prefix[prefix_matched_]) {
          line_ = ++prefix_matched_ == prefix.size() ? line::after_prefix : line::prefix;
        } else {
          line_ = c == '\n' ? line::start : line::rest;
        }
        break;
      case line::after_prefix:
        if (c == ' ') {
          line_ = line::after_space;
          break;
        }
        first_value_byte(c);
        break;
      case line::after_space: first_value_byte(c); break;
      case line::rest: break;
    }
  }
}

// The first byte of an event's data: `[DONE]` ends the stream and an empty line carries nothing; anything
// else is an event of the stream.
void usage_scanner::first_value_byte(char c) noexcept {
  if (c != '[' && c != '\n' && c != '\r') ++events_;
  line_ = c == '\n' ? line::start : line::rest;
}

}  // namespace dplb::metrics
