#include "dplb/balancer/round_robin.hpp"

namespace dplb::balancer {

std::optional<std::size_t> round_robin::choose(std::span<const rank_view> ranks) {
  const std::size_t n = ranks.size();
  for (std::size_t step = 0; step < n; ++step) {
    const std::size_t candidate = (next_ + step) % n;
    if (ranks[candidate].usable) {
      next_ = (candidate + 1) % n;
      return candidate;
    }
  }
  return std::nullopt;
}

}  // namespace dplb::balancer
