#pragma once
// The configuration's value parsers: text in, a value (or why the text is refused) out. Pure functions, no
// knowledge of which option or source a value came from (option_table.hpp adds that to the messages).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "dplb/config/settings.hpp"

namespace dplb::config::detail {

// A day: longer than any sane generation, and small enough that adding it to a steady_clock time point can
// never overflow.
constexpr std::uint64_t max_timeout_ms = 86'400'000;

// "host:port", IPv6 in brackets.
std::string format_listen(const listen_address& a);
std::string to_lower(std::string_view s);
// Digits only: a sign, spaces or a suffix ("5s") are refused rather than half-parsed.
std::optional<std::uint64_t> parse_unsigned(std::string_view s);
// Whole milliseconds ("250"), or with an explicit unit: "250ms", "2s", "0.1s" (at most millisecond precision).
std::optional<std::uint64_t> parse_milliseconds(std::string_view s);
// true or false, also as 1 or 0, yes or no, on or off, in any case (the spellings environment files use).
std::optional<bool> parse_boolean(std::string_view s);
// HOST:PORT or [IPV6]:PORT into `out`; returns why the text is refused, "" when it is good.
std::string parse_listen(std::string_view text, listen_address& out);
// A non-negative decimal number, at most 1000 (kv-pressure-weight); returns why it is refused, "" when good.
std::string parse_weight(std::string_view text, double& out);
std::string format_weight(double value);
// "a, b or c" with sep ", " and last_sep " or ".
std::string join(std::span<const std::string_view> items, std::string_view sep, std::string_view last_sep);
// `s` without leading and trailing blanks (spaces, tabs).
std::string_view trim(std::string_view s);
// The canonical spelling of a choice, matched case-insensitively; nullopt when it is none of them.
std::optional<std::string_view> canonical_choice(std::span<const std::string_view> choices, std::string_view text);

// Edit distance, to suggest the option or key that a typo meant.
std::size_t distance(std::string_view a, std::string_view b);

// The name among `names` nearest to `typo`, when one is near enough to be what was meant.
template <typename Names>
std::optional<std::string> closest(std::string_view typo, const Names& names) {
  std::optional<std::string> best;
  std::size_t best_d = std::max<std::size_t>(2, typo.size() / 3) + 1;
  for (std::string_view n : names) {
    if (n.empty()) continue;
    if (const std::size_t d = distance(typo, n); d < best_d) {
      best_d = d;
      best = std::string(n);
    }
  }
  return best;
}

}  // namespace dplb::config::detail
