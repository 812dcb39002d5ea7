#include "dplb/balancer/least_inflight.hpp"

namespace dplb::balancer {

std::optional<std::size_t> least_inflight::choose(const pick_context&, std::span<const rank_view> ranks) {
  return lowest_score(ranks, ties_, [](const rank_view& h) { return h.inflight / h.weight; });
}

}  // namespace dplb::balancer
