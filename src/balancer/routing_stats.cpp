#include "dplb/balancer/routing_stats.hpp"

namespace dplb::balancer {

routing_stats::routing_stats(std::size_t rank_capacity)
    // Tokens: a block is 64; a system prompt is hundreds; a long shared document thousands.
    : matched_tokens({0, 64, 256, 1024, 4096, 16384, 65536}),
      index_blocks(std::make_unique<std::atomic<std::uint64_t>[]>(rank_capacity)),
      capacity(rank_capacity) {}

}  // namespace dplb::balancer
