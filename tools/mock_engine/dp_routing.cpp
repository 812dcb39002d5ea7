#include "dp_routing.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace dplb::mock {
namespace {

// Python's int() of the header, as vLLM reads it: optional blanks around, an optional sign, digits.
// nullopt for anything else; a value beyond 64 bits is out of any range, kept as INT64_MAX/MIN.
std::optional<std::int64_t> parse_integer(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return std::nullopt;
  text = text.substr(first, text.find_last_not_of(" \t") - first + 1);
  const bool negative = text.front() == '-';
  if (text.front() == '+' || negative) text.remove_prefix(1);
  if (text.empty() || text.front() < '0' || text.front() > '9') return std::nullopt;
  std::uint64_t magnitude = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), magnitude);
  if (end != text.data() + text.size()) return std::nullopt;
  // Digits all the way but too many for 64 bits: still an integer, and out of any range.
  constexpr std::uint64_t max = INT64_MAX;
  if (ec == std::errc::result_out_of_range || magnitude > max) return negative ? INT64_MIN : INT64_MAX;
  return negative ? -static_cast<std::int64_t>(magnitude) : static_cast<std::int64_t>(magnitude);
}

}  // namespace

engine_wish read_dp_rank_header(std::optional<std::string_view> header, unsigned engines, unsigned own_rank) {
  if (!header) return any_engine{};
  const auto value = parse_integer(*header);
  if (!value) return any_engine{};
  if (engines > 1) {
    if (*value >= 0 && *value < static_cast<std::int64_t>(engines)) return static_cast<unsigned>(*value);
    return "X-data-parallel-rank " + std::to_string(*value) + " is out of range: this server has data-parallel " +
           "ranks [0, " + std::to_string(engines) + ")";
  }
  if (*value == 0 || *value == static_cast<std::int64_t>(own_rank)) return 0U;
  return "X-data-parallel-rank " + std::to_string(*value) + " is not this server's data-parallel rank (" +
         std::to_string(own_rank) + ")";
}

std::int64_t in_flight_ceiling(std::int64_t total_in_flight, unsigned engines, double load_bound) {
  const double share = load_bound * static_cast<double>(total_in_flight + 1) / static_cast<double>(engines);
  // Less a hair, so that a share meant to be an integer (1.1 * 10 / 11) is not pushed to the next one
  // by the rounding of its product (1.0000000000000002).
  return static_cast<std::int64_t>(std::ceil(share - 1e-9));
}

// Why the fallback needs no bound check: the least busy engine has at most floor(T / N) in flight, and
// floor(T / N) + 1 = ceil((T + 1) / N) <= ceil(C * (T + 1) / N) for C >= 1.
unsigned choose_by_cached_prefix(std::span<const engine_outlook> engines, double load_bound) {
  const auto count = static_cast<unsigned>(engines.size());
  std::int64_t total = 0;
  for (const auto& e : engines) total += e.in_flight;
  const auto ceiling = in_flight_ceiling(total, count, load_bound);
  std::optional<unsigned> best;
  for (unsigned j = 0; j < count; ++j) {
    const auto& e = engines[j];
    if (e.cached_blocks == 0 || e.in_flight + 1 > ceiling) continue;
    // Strictly better only: an equal engine of a higher index never displaces a lower one.
    if (!best || e.cached_blocks > engines[*best].cached_blocks ||
        (e.cached_blocks == engines[*best].cached_blocks && e.in_flight < engines[*best].in_flight)) {
      best = j;
    }
  }
  if (best) return *best;
  return least_busy(count, [&](unsigned j) { return engines[j].in_flight; });
}

}  // namespace dplb::mock
