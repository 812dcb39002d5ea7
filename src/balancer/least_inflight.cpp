#include "dplb/balancer/least_inflight.hpp"

namespace dplb::balancer {

std::optional<std::size_t> least_inflight::choose(const pick_context&, std::span<const host_view> hosts) {
  // Counting the request being placed (+1) is what makes weights split a burst in their ratio from the
  // first request: with weights 2 and 1 on idle ranks, 1/2 < 1/1 sends the first to the heavier rank.
  return lowest_in_rotation(hosts, next_, [](const host_view& h) { return (h.inflight + 1.0) / h.weight; });
}

}  // namespace dplb::balancer
