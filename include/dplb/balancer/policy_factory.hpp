#pragma once
#include <memory>
#include <string_view>

#include "dplb/balancer/policy.hpp"
#include "dplb/support/policy_names.hpp"
#include "dplb/balancer/prefix_aware.hpp"

namespace dplb::balancer {

struct policy_options {
  double kv_weight = 6.0;  // least-load's weight of KV-cache pressure (--kv-pressure-weight)
  prefix_aware_options prefix;     // prefix-aware's (--load-bound, --prefix-min-match, --prefix-index-blocks)
  routing_stats* stats = nullptr;  // where prefix-aware counts its decisions; null: not counted
};

// Makes the policy with that name; nullptr for an unknown name (config validation reports it).
std::unique_ptr<policy> make_policy(std::string_view name, const policy_options& options = {});

}  // namespace dplb::balancer
