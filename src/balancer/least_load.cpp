#include "dplb/balancer/least_load.hpp"

#include <algorithm>

namespace dplb::balancer {

double least_load::load_of(const rank_view& rank) const noexcept {
  double load = rank.inflight;
  if (rank.engine.fresh) {
    const auto& e = rank.engine.load;
    const double reported = static_cast<double>(e.running) + e.waiting;
    const double unseen_by_dplb = std::max(0.0, reported - rank.engine.inflight_at_read);
    load += unseen_by_dplb + kv_weight_ * e.waiting * std::max(0.0, e.kv_cache_usage - 0.5);
  }
  return load;
}

double least_load::engine_floor(const rank_view& rank) const noexcept {
  if (!rank.engine.fresh) return 0;
  const auto& e = rank.engine.load;
  return static_cast<double>(e.running) + e.waiting + kv_weight_ * e.waiting * std::max(0.0, e.kv_cache_usage - 0.5);
}

std::optional<std::size_t> least_load::choose(const pick_context&, std::span<const rank_view> ranks) {
  return lowest_score(ranks, ties_, [this](const rank_view& h) { return load_of(h) / h.weight; });
}

}  // namespace dplb::balancer
