#pragma once
#include <array>
#include <memory>
#include <string_view>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// Every policy name dplb accepts, in the order --help lists them: the two real policies first, then the
// two baselines kept for benchmarks (see docs/benchmarks.md).
inline constexpr std::array<std::string_view, 4> policy_names{"round-robin", "least-inflight", "random",
                                                             "engine-stats"};

// Makes the policy with that name; nullptr for an unknown name (config validation reports it).
std::unique_ptr<policy> make_policy(std::string_view name);

}  // namespace dplb::balancer
