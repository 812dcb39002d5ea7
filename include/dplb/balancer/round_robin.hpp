#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// Every usable rank in turn, ignoring load (the `rotation` tie-breaker over all of them): strict rotation
// with equal weights, so a burst of K*m requests over K usable ranks sends exactly m to each and a rank
// that is not usable is skipped without losing the rotation's place; smooth weighted round-robin
// otherwise.
class round_robin final : public policy {
 public:
  std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) override;
  std::string_view name() const noexcept override { return "round-robin"; }

 private:
  rotation turns_;
};

}  // namespace dplb::balancer
