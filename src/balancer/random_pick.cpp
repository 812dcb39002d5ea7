#include "dplb/balancer/random_pick.hpp"

namespace dplb::balancer {

std::optional<std::size_t> random_pick::choose(const pick_context&, std::span<const rank_view> ranks) {
  double total = 0;
  for (const auto& h : ranks) total += h.usable ? h.weight : 0.0;
  if (total <= 0) return std::nullopt;
  // A point on the line of the usable ranks' weights laid end to end: ranks that are down take no room,
  // so they are skipped without biasing the others.
  double point = std::uniform_real_distribution<double>(0, total)(engine_);
  std::optional<std::size_t> last;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!ranks[i].usable) continue;
    last = i;
    if (point < ranks[i].weight) return i;
    point -= ranks[i].weight;
  }
  return last;  // rounding left the point at the very end
}

}  // namespace dplb::balancer
