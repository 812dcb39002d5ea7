#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// The usable rank with the fewest tokens outstanding per unit of weight once it takes this request:
// lowest (cost_inflight + cost) / weight, ties in rotation. A request's cost is its prompt tokens plus
// the most it may generate (pick_context), and the balancer gives the prompt part back at the response's
// first byte (the prefill is done then), the rest at the end. A 30,000-token prompt thus weighs what it
// costs the engine, not what a 100-token one does, and uniform requests still spread exactly.
class least_tokens final : public policy {
 public:
  std::optional<std::size_t> choose(const pick_context& request, std::span<const host_view> hosts) override;
  std::string_view name() const noexcept override { return "least-tokens"; }
  bool needs_request_facts() const noexcept override { return true; }

 private:
  std::size_t next_ = 0;
};

}  // namespace dplb::balancer
