#pragma once
// Session affinity (--affinity-header): consistent hashing with bounded loads. Each rank owns points on a
// hash ring; a session key goes to the rank owning the first point at or after the key's hash, unless that
// rank is over the load bound, in which case the walk goes on to the next rank that is within it. So a
// session stays on one rank while the load allows (where its KV cache is), no rank becomes a hot spot, and
// when a rank comes or goes only the keys whose walk meets it move.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

class affinity_ring {
 public:
  // Points per rank: enough that the ranks' shares of the ring differ by a few percent at most.
  static constexpr std::size_t points_per_rank = 128;

  // Adds ranks first..first+count-1 (rank numbers are never reused).
  void add_ranks(std::size_t first, std::size_t count);

  struct placement {
    std::size_t rank = 0;
    bool moved = false;  // the key's own rank (the first usable one on its walk) was over the bound
  };
  // The rank for `key` among the usable ranks allowed by `allows(rank)`; nullopt if none is usable.
  template <class Allows>
  std::optional<placement> place(std::string_view key, std::span<const rank_view> ranks, Allows allows) const {
    if (points_.empty()) return std::nullopt;
    const std::uint64_t h = hash(key);
    auto at = std::lower_bound(points_.begin(), points_.end(), std::pair<std::uint64_t, std::uint32_t>{h, 0});
    bool first_usable_seen = false;
    for (std::size_t step = 0; step < points_.size(); ++step, ++at) {
      if (at == points_.end()) at = points_.begin();
      const std::size_t rank = at->second;
      if (rank >= ranks.size() || !ranks[rank].usable) continue;
      if (allows(ranks[rank])) return placement{rank, first_usable_seen};
      first_usable_seen = true;  // over the bound: the walk goes on
    }
    return std::nullopt;
  }

  static std::uint64_t hash(std::string_view key);

 private:
  std::vector<std::pair<std::uint64_t, std::uint32_t>> points_;  // (point, rank), sorted
};

}  // namespace dplb::balancer
