#include "dplb/balancer/engine_stats.hpp"

namespace dplb::balancer {

std::optional<std::size_t> engine_stats::choose(const pick_context&, std::span<const rank_view> ranks) {
  // Before the first snapshot every rank looks idle, as the client's zeroed counts do at start-up.
  if (estimate_.size() != ranks.size()) estimate_.assign(ranks.size(), engine_load{});
  std::optional<std::size_t> best;
  double best_score = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!ranks[i].usable) continue;
    const double score = (4.0 * estimate_[i].waiting + estimate_[i].running) / ranks[i].weight;
    if (!best || score < best_score) best = i, best_score = score;
  }
  if (best) ++estimate_[*best].waiting;
  return best;
}

void engine_stats::on_engine_stats(std::span<const engine_load> snapshot) {
  estimate_.assign(snapshot.begin(), snapshot.end());
}

}  // namespace dplb::balancer
