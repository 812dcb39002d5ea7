#pragma once
#include <vector>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// Rotation over the usable ranks, ignoring load. With equal weights it is strict rotation: a burst of
// K*m requests over K usable ranks sends exactly m to each, and a rank that is not usable is skipped
// without losing the rotation's place. With different weights it is nginx's smooth weighted
// round-robin: each pick adds every usable rank's weight to its credit and takes the rank with the most
// credit (the first in rank order on a tie), which then pays the total; with weights 2:1 the order is
// A B A, never A A B.
class round_robin final : public policy {
 public:
  std::optional<std::size_t> choose(const pick_context& request, std::span<const host_view> hosts) override;
  std::string_view name() const noexcept override { return "round-robin"; }

 private:
  std::size_t next_ = 0;        // equal weights: the rank the rotation tries first on the next pick
  std::vector<double> credit_;  // different weights: each rank's credit
};

}  // namespace dplb::balancer
