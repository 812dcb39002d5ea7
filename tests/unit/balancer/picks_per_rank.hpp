#pragma once
// Shared by the balancer tests: how many requests the balancer ever sent to each rank.

#include <cstdint>
#include <vector>

#include "dplb/balancer/balancer.hpp"

namespace dplb::balancer::test {

inline std::vector<std::uint64_t> picks_per_rank(const balancer& b) {
  std::vector<std::uint64_t> out;
  for (std::size_t r = 0; r < b.rank_count(); ++r) out.push_back(b.picks(r));
  return out;
}

}  // namespace dplb::balancer::test
