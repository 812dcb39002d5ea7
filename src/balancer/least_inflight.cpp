#include "dplb/balancer/least_inflight.hpp"

namespace dplb::balancer {

std::optional<std::size_t> least_inflight::choose(std::span<const rank_view> ranks) {
  const std::size_t n = ranks.size();
  std::optional<std::size_t> best;
  // Scanning in rotation order from next_ and keeping the first strict minimum breaks ties in
  // rotation: equal ranks take turns instead of the lowest index winning every tie.
  for (std::size_t step = 0; step < n; ++step) {
    const std::size_t candidate = (next_ + step) % n;
    if (!ranks[candidate].usable) continue;
    if (!best || ranks[candidate].inflight < ranks[*best].inflight) best = candidate;
  }
  if (best) next_ = (*best + 1) % n;
  return best;
}

}  // namespace dplb::balancer
