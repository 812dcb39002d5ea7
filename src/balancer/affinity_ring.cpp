#include "dplb/balancer/affinity_ring.hpp"

#include <algorithm>

namespace dplb::balancer {
namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

// FNV-1a, then mixed: stable across processes and builds, so that dplb replicas agree on a key's rank.
std::uint64_t affinity_ring::hash(std::string_view key) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : key) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return mix(h);
}

void affinity_ring::add_ranks(std::size_t first, std::size_t count) {
  for (std::size_t rank = first; rank < first + count; ++rank) {
    for (std::size_t p = 0; p < points_per_rank; ++p) {
      points_.emplace_back(mix((std::uint64_t{rank} << 20) ^ p ^ 0x5bd1e995ULL), static_cast<std::uint32_t>(rank));
    }
  }
  std::sort(points_.begin(), points_.end());
}

}  // namespace dplb::balancer
