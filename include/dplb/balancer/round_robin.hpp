#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// Strict rotation over the usable ranks, ignoring load: a burst of K*m requests over K usable ranks
// sends exactly m to each. A rank that is not usable is skipped without losing the rotation's place.
class round_robin final : public policy {
 public:
  std::optional<std::size_t> choose(std::span<const rank_view> ranks) override;
  std::string_view name() const noexcept override { return "round-robin"; }

 private:
  std::size_t next_ = 0;  // the rank the rotation tries first on the next pick
};

}  // namespace dplb::balancer
