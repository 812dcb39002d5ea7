#pragma once
// Shared by the queue tests that place requests by prefix: a group's prompt (8 blocks of one letter) as its
// prefix chain, and a pick that carries a chain.

#include <string>
#include <vector>

#include "dplb/balancer/policy.hpp"
#include "dplb/balancer/prefix_index.hpp"

namespace dplb::balancer::test {

inline std::vector<prefix_hash> group_chain(char group) {
  prefix_chain_builder b(0);
  b.feed(std::string(8 * prefix_block_bytes, group));
  return b.take();
}

inline pick_context with_chain(const std::vector<prefix_hash>& chain) {
  pick_context c;
  c.prefix_chain = chain;
  return c;
}

}  // namespace dplb::balancer::test
