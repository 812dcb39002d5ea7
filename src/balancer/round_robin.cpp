#include "dplb/balancer/round_robin.hpp"

namespace dplb::balancer {

std::optional<std::size_t> round_robin::choose(const pick_context&, std::span<const host_view> hosts) {
  return turns_.pick(hosts, [&](std::size_t i) { return hosts[i].usable; });
}

}  // namespace dplb::balancer
