#pragma once
// The names of the balancing policies, without the policies: what the configuration needs to check a
// --policy value and to list the choices in --help. policy_factory.hpp makes a policy from its name.

#include <array>
#include <string_view>

namespace dplb::balancer {

// Every policy name dplb accepts, in the order --help lists them: dplb's policies first, then the two
// baselines kept for benchmarks (see docs/benchmarks.md).
inline constexpr std::array<std::string_view, 7> policy_names{"round-robin", "least-inflight", "least-load",
                                                             "least-tokens", "prefix-aware", "random", "engine-stats"};

}  // namespace dplb::balancer
