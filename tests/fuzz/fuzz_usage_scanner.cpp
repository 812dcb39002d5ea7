// libFuzzer target for dplb::metrics::usage_scanner, the streaming search for the token counts in a
// response body. Checks, for every input:
//  - split invariance: feeding the body in pieces (1-3 cut points derived from the input, plus an empty
//    piece, plus one byte at a time) gives the same result as feeding it whole, as the network may
//    split a body anywhere;
//  - agreement with a reference written the obvious way (a search over the whole buffer, no state
//    machine), so that the scanner's result is the documented rule and not only self-consistent.
// Any difference traps with both results printed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string_view>

#include "dplb/metrics/usage_scanner.hpp"

namespace {

using dplb::metrics::usage_scanner;

struct usage {
  std::optional<std::uint64_t> prompt;
  std::optional<std::uint64_t> completion;
  bool operator==(const usage&) const = default;
};

usage result_of(const usage_scanner& s) { return {s.prompt_tokens(), s.completion_tokens()}; }

void print(const char* label, const usage& u) {
  auto show = [](const std::optional<std::uint64_t>& v) {
    return v ? static_cast<unsigned long long>(*v) : 0ull;
  };
  std::fprintf(stderr, "  %-10s prompt=%s%llu completion=%s%llu\n", label, u.prompt ? "" : "(none)",
               show(u.prompt), u.completion ? "" : "(none)", show(u.completion));
}

[[noreturn]] void mismatch(const char* what, const usage& expected, const usage& got) {
  std::fprintf(stderr, "fuzz_usage_scanner: %s\n", what);
  print("expected", expected);
  print("got", got);
  __builtin_trap();
}

// The reference. A count is `"prompt_tokens"` or `"completion_tokens"` (quotes included), optional JSON
// whitespace (space, tab, CR, LF), ':', optional whitespace, one or more ASCII digits, then one byte that
// is not a digit: a number still running at the end of the bytes seen is not complete, so not counted.
// The last complete count of each key wins.
//
// Two corners are spelled out because the scanner's state machine decides them and a plain regex
// search would not:
//  - The closing quote of a complete key name is never also the opening quote of another key (in
//    `"prompt_tokens"completion_tokens":1,` nothing is found). In JSON a key's closing quote is followed
//    by whitespace or ':', so this never matters for real responses.
//  - A number too long for 64 bits saturates: it keeps the value of its shortest prefix that reaches
//    `max_value` (UINT64_MAX / 10 - 10), whatever digits follow.
constexpr std::uint64_t max_value = UINT64_MAX / 10 - 10;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

usage reference_scan(std::string_view s) {
  static constexpr std::string_view keys[] = {"prompt_tokens", "completion_tokens"};
  usage found;
  std::size_t i = 0;
  while ((i = s.find('"', i)) != std::string_view::npos) {
    std::size_t next = i + 1;
    for (std::size_t k = 0; k < 2; ++k) {
      const auto key = keys[k];
      if (s.substr(i + 1, key.size()) != key || i + 1 + key.size() >= s.size() || s[i + 1 + key.size()] != '"') {
        continue;
      }
      const std::size_t after_key = i + key.size() + 2;
      next = after_key;  // the closing quote is spent, whatever follows
      std::size_t j = after_key;
      while (j < s.size() && is_space(s[j])) ++j;
      if (j == s.size() || s[j] != ':') break;
      ++j;
      while (j < s.size() && is_space(s[j])) ++j;
      const std::size_t digits = j;
      while (j < s.size() && is_digit(s[j])) ++j;
      if (j == digits || j == s.size()) break;  // no number, or one that may still go on
      unsigned __int128 value = 0;
      for (std::size_t d = digits; d < j; ++d) {
        value = value * 10 + static_cast<unsigned>(s[d] - '0');
        if (value >= max_value) break;
      }
      (k == 0 ? found.prompt : found.completion) = static_cast<std::uint64_t>(value);
      next = j;  // the byte that ended the number may open the next key
      break;
    }
    i = next;
  }
  return found;
}

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);

  usage_scanner whole;
  whole.feed(body);
  const usage expected = result_of(whole);

  const usage reference = reference_scan(body);
  if (reference != expected) mismatch("scanner disagrees with the reference", reference, expected);

  // 1-3 cut points from a hash of the input: the body stays the fuzzed bytes as they are (seeds are
  // plain response bodies), and every mutation gets other splits.
  std::uint64_t seed = 1469598103934665603ull;
  for (unsigned char c : body) seed = (seed ^ c) * 1099511628211ull;
  std::size_t cuts[3];
  const std::size_t count = 1 + splitmix64(seed) % 3;
  for (std::size_t k = 0; k < count; ++k) cuts[k] = size ? splitmix64(seed) % (size + 1) : 0;
  std::sort(cuts, cuts + count);
  usage_scanner pieces;
  std::size_t at = 0;
  for (std::size_t k = 0; k < count; ++k) {
    pieces.feed(body.substr(at, cuts[k] - at));
    at = cuts[k];
    if (k == 0) pieces.feed({});  // an empty read changes nothing
  }
  pieces.feed(body.substr(at));
  if (result_of(pieces) != expected) mismatch("split feed differs from the whole feed", expected, result_of(pieces));

  usage_scanner bytewise;
  for (std::size_t k = 0; k < size; ++k) bytewise.feed(body.substr(k, 1));
  if (result_of(bytewise) != expected) {
    mismatch("byte-at-a-time feed differs from the whole feed", expected, result_of(bytewise));
  }
  return 0;
}
