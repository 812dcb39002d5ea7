#include "dplb/balancer/policy_factory.hpp"

#include <array>

#include "dplb/balancer/least_inflight.hpp"
#include "dplb/balancer/round_robin.hpp"

namespace dplb::balancer {

namespace {
constexpr std::array<std::string_view, 2> known_policies{"round-robin", "least-inflight"};
}

std::span<const std::string_view> policy_names() noexcept { return known_policies; }

std::unique_ptr<policy> make_policy(std::string_view name) {
  if (name == "round-robin") return std::make_unique<round_robin>();
  if (name == "least-inflight") return std::make_unique<least_inflight>();
  return nullptr;
}

}  // namespace dplb::balancer
