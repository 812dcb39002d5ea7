#include "dplb/balancer/random_pick.hpp"

#include <algorithm>

namespace dplb::balancer {

std::optional<std::size_t> random_pick::choose(std::span<const rank_view> ranks) {
  const auto usable = static_cast<std::size_t>(
      std::count_if(ranks.begin(), ranks.end(), [](const rank_view& r) { return r.usable; }));
  if (usable == 0) return std::nullopt;
  // The k-th usable rank, k uniform: ranks that are down are skipped without biasing the others.
  auto k = std::uniform_int_distribution<std::size_t>(0, usable - 1)(engine_);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].usable && k-- == 0) return i;
  }
  return std::nullopt;  // unreachable: k < usable
}

}  // namespace dplb::balancer
