#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// The usable rank with the fewest in-proxy in-flight requests per unit of weight (inflight / weight), as
// nginx's least_conn. Ties go to the `rotation`: in turn with equal weights, so a burst onto idle, equal
// ranks is exactly round-robin and under uniform load max - min in-flight over usable ranks never exceeds
// 1; smooth weighted round-robin otherwise, so idle ranks of weights 3 and 1 still split 3:1.
class least_inflight final : public policy {
 public:
  std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) override;
  std::string_view name() const noexcept override { return "least-inflight"; }

 private:
  rotation ties_;
};

}  // namespace dplb::balancer
