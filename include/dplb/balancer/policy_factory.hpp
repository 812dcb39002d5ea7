#pragma once
#include <array>
#include <memory>
#include <string_view>

#include "dplb/balancer/policy.hpp"
#include "dplb/balancer/prefix_aware.hpp"

namespace dplb::balancer {

// Every policy name dplb accepts, in the order --help lists them: dplb's policies first, then the two
// baselines kept for benchmarks (see docs/benchmarks.md).
inline constexpr std::array<std::string_view, 7> policy_names{"round-robin", "least-inflight", "least-load",
                                                             "least-tokens", "prefix-aware", "random", "engine-stats"};

struct policy_options {
  double kv_weight = 6.0;  // least-load's weight of KV-cache pressure (--kv-pressure-weight)
  prefix_aware_options prefix;     // prefix-aware's (--load-bound, --prefix-min-match, --prefix-index-blocks)
  routing_stats* stats = nullptr;  // where prefix-aware counts its decisions; null: not counted
};

// Makes the policy with that name; nullptr for an unknown name (config validation reports it).
std::unique_ptr<policy> make_policy(std::string_view name, const policy_options& options = {});

}  // namespace dplb::balancer
