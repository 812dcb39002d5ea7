#include "dplb/balancer/round_robin.hpp"

namespace dplb::balancer {

std::optional<std::size_t> round_robin::choose(const pick_context&, std::span<const rank_view> ranks) {
  return turns_.pick(ranks, [&](std::size_t i) { return ranks[i].usable; });
}

}  // namespace dplb::balancer
