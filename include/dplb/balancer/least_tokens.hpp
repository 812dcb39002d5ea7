#pragma once
#include <vector>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// The usable rank with the fewest tokens outstanding per unit of weight once it takes this request,
// (cost_inflight + cost) / weight. A request's cost is its prompt tokens plus the most it may generate
// (pick_context), and the balancer gives the prompt part back at the response's first byte (the prefill
// is done then), the rest at the end. A 30,000-token prompt thus weighs what it costs the engine, not
// what a 100-token one does.
// Ranks whose token loads are within this request's cost of the lowest are a tie, and a tie goes to the
// fewest requests in flight per weight, and a tie of those to the `rotation` (least-inflight). Token counts of text prompts are
// estimates that differ from request to request of a uniform benchmark (the same 1,024 tokens are more or
// fewer characters), and balancing those differences would split a burst 65/63 where the requests are
// the same: a rank's decode batch, what lockstep DP ranks pad to, is a count of requests. Tokens decide
// only when they differ by more than a request.
class least_tokens final : public policy {
 public:
  std::optional<std::size_t> choose(const pick_context& request, std::span<const host_view> hosts) override;
  std::string_view name() const noexcept override { return "least-tokens"; }
  bool needs_request_facts() const noexcept override { return true; }

 private:
  rotation ties_;
  std::vector<host_view> near_;  // scratch: the hosts in the tie, the others marked unusable
};

}  // namespace dplb::balancer
