#include "dplb/balancer/engine_stats.hpp"

#include <limits>

namespace dplb::balancer {

std::optional<std::size_t> engine_stats::choose(std::span<const rank_view> ranks) {
  // Before the first snapshot every rank looks idle, as the client's zeroed counts do at start-up.
  if (estimate_.size() != ranks.size()) estimate_.assign(ranks.size(), engine_load{});
  std::optional<std::size_t> best;
  std::uint64_t best_score = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!ranks[i].usable) continue;
    const std::uint64_t score = 4 * std::uint64_t{estimate_[i].waiting} + estimate_[i].running;
    if (score < best_score) {
      best_score = score;
      best = i;
    }
  }
  if (best) ++estimate_[*best].waiting;
  return best;
}

void engine_stats::on_engine_stats(std::span<const engine_load> snapshot) {
  estimate_.assign(snapshot.begin(), snapshot.end());
}

}  // namespace dplb::balancer
