#pragma once
#include <random>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// A BASELINE, not a recommendation: a random usable rank, whatever the load, with a probability in
// proportion to its weight. It is what a balancer with no view of load at all achieves;
// bench/imbalance.sh measures what it costs.
class random_pick final : public policy {
 public:
  explicit random_pick(std::uint64_t seed = std::random_device{}()) : engine_(seed) {}
  std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) override;
  std::string_view name() const noexcept override { return "random"; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace dplb::balancer
