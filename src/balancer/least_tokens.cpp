#include "dplb/balancer/least_tokens.hpp"

#include <algorithm>

namespace dplb::balancer {

std::optional<std::size_t> least_tokens::choose(const pick_context& request, std::span<const host_view> hosts) {
  // A request whose cost is unknown (no body facts) still counts as one token, so that it spreads.
  const double cost = std::max(1.0, static_cast<double>(request.prompt_tokens) + request.decode_tokens);
  return lowest_in_rotation(hosts, next_,
                            [cost](const host_view& h) { return (static_cast<double>(h.cost_inflight) + cost) / h.weight; });
}

}  // namespace dplb::balancer
