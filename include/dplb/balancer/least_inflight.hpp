#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// The usable rank that would have the fewest in-proxy in-flight requests per unit of weight once it took
// this one: lowest (inflight + 1) / weight. Ties are broken in rotation starting just after the previous
// pick, so a burst onto idle, equal ranks is exactly round-robin, and under uniform load max - min
// in-flight over usable ranks of equal weight never exceeds 1.
class least_inflight final : public policy {
 public:
  std::optional<std::size_t> choose(const pick_context& request, std::span<const host_view> hosts) override;
  std::string_view name() const noexcept override { return "least-inflight"; }

 private:
  std::size_t next_ = 0;  // where the tie-breaking rotation starts on the next pick
};

}  // namespace dplb::balancer
