#include "dplb/balancer/affinity_ring.hpp"

#include <algorithm>

#include "dplb/support/hashing.hpp"

namespace dplb::balancer {
using support::mix64;

// A fixed function: every dplb replica puts a key on the same rank.
std::uint64_t affinity_ring::hash(std::string_view key) { return support::hash_bytes(key); }

void affinity_ring::add_ranks(std::size_t first, std::size_t count) {
  for (std::size_t rank = first; rank < first + count; ++rank) {
    for (std::size_t p = 0; p < points_per_rank; ++p) {
      points_.emplace_back(mix64((std::uint64_t{rank} << 20) ^ p ^ 0x5bd1e995ULL), static_cast<std::uint32_t>(rank));
    }
  }
  std::sort(points_.begin(), points_.end());
}

}  // namespace dplb::balancer
