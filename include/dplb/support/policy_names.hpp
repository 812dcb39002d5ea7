#pragma once
// The names of the balancing policies, without the policies: what the configuration needs to check a
// --policy value and to list the choices in --help. They live below both: the configuration includes
// nothing of the balancer, and balancer/policy_factory.hpp makes a policy from its name.

#include <array>
#include <string_view>

namespace dplb::support {

// Every policy name dplb accepts, in the order --help lists them: dplb's policies first, then the two
// baselines kept for benchmarks (see docs/benchmarks.md).
inline constexpr std::array<std::string_view, 7> policy_names{"round-robin", "least-inflight", "least-load",
                                                             "least-tokens", "prefix-aware", "random", "engine-stats"};

}  // namespace dplb::support
