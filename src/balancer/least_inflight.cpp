#include "dplb/balancer/least_inflight.hpp"

namespace dplb::balancer {

std::optional<std::size_t> least_inflight::choose(const pick_context&, std::span<const host_view> hosts) {
  return lowest_score(hosts, ties_, [](const host_view& h) { return h.inflight / h.weight; });
}

}  // namespace dplb::balancer
