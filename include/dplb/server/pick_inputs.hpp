#pragma once
// What the picks of a request read of its body, fixed for the process by the configuration (worked out once,
// in shared_state, and read by every session). A cluster's policy may weigh the body's facts (least-tokens: its tokens; prefix-aware: its
// prompt's prefix, and the KV-cache events its token ids match), and so may a disaggregated cluster's two
// other readers: its prefill pool's policy (the prefill leg's pick), and the skip of its prefill leg
// (--pd-skip-prefill-ratio: whether the decode rank's KV-cache events hold the prompt). A body nobody reads
// is never parsed.

#include <cstddef>

#include "dplb/balancer/balancer.hpp"
#include "dplb/config/settings.hpp"

namespace dplb::server {

class pick_inputs {
 public:
  pick_inputs(const config::settings& settings, const balancer::balancer& balancer)
      : settings_(settings), balancer_(balancer),
        disaggregated_(config::any_cluster_disaggregated(settings)),
        checks_skip_(disaggregated_ && settings.pd_skip_prefill_ratio > 0),
        prefix_chain_(config::any_cluster_uses(settings, "prefix-aware") || checks_skip_) {
    for (std::size_t c = 0; c < settings.clusters.size(); ++c) any_body_ = any_body_ || body_for(c);
  }

  // Some cluster runs its completions in two legs.
  bool disaggregated() const noexcept { return disaggregated_; }
  // Some request's body is read for a pick (else only model routing reads it).
  bool body_for_any() const noexcept { return any_body_; }
  // The body's reading collects its prompt's prefix chain and token ids (request_facts).
  bool prefix_chain() const noexcept { return prefix_chain_; }

  // A request of `cluster` has its body's facts read for its picks.
  bool body_for(std::size_t cluster) const {
    const auto& spec = settings_.clusters[cluster];
    return balancer_.policy_of(cluster).needs_request_facts() ||
           (spec.prefill_pool && balancer_.policy_of(*spec.prefill_pool).needs_request_facts()) ||
           may_skip_prefill(cluster);
  }

  // A request of `cluster` has its prompt matched against the KV-cache events: for a prefix-aware pick of its
  // rank or of its prefill rank, or for the skip of its prefill leg.
  bool kv_events_for(std::size_t cluster) const {
    const auto& spec = settings_.clusters[cluster];
    const auto prefix_aware = [&](std::size_t c) { return balancer_.policy_of(c).name() == "prefix-aware"; };
    return prefix_aware(cluster) || (spec.prefill_pool && prefix_aware(*spec.prefill_pool)) || may_skip_prefill(cluster);
  }

  // A completion of `cluster` may run in one leg on its decode rank, when that rank holds its prompt.
  bool may_skip_prefill(std::size_t cluster) const {
    return checks_skip_ && settings_.clusters[cluster].disaggregated();
  }

 private:
  const config::settings& settings_;
  const balancer::balancer& balancer_;
  bool disaggregated_;
  bool checks_skip_;
  bool prefix_chain_;
  bool any_body_ = false;
};

}  // namespace dplb::server
