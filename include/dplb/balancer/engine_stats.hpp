#pragma once
#include <vector>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// A BASELINE, not a recommendation: a balancer fed only by periodic engine stats, as vLLM's Python
// client is (its DP coordinator publishes each engine's waiting and running counts every 100 ms).
// It picks the usable rank with the lowest score (4 * waiting + running) / weight (first minimum in
// rank order), then counts the pick as one more waiting request on that rank, so picks between two
// snapshots still spread. Each new snapshot replaces those local counts: picks the engines have not
// reported yet are forgotten, and the next picks pile onto whichever rank the stale snapshot shows as
// emptiest. That is the flaw dplb exists to remove; bench/imbalance.sh measures what it costs.
class engine_stats final : public policy {
 public:
  std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) override;
  std::string_view name() const noexcept override { return "engine-stats"; }
  bool uses_engine_stats() const noexcept override { return true; }
  void on_engine_stats(std::span<const engine_load> snapshot) override;

 private:
  std::vector<engine_load> estimate_;  // the last snapshot plus the picks made since; empty until the first
};

}  // namespace dplb::balancer
