#pragma once
// What the prefix-aware policy and session affinity decided, counted for /metrics. Written under the
// balancer's pick lock, read by scrapes without it (relaxed atomics: each value is read alone).

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>

#include "dplb/balancer/policy.hpp"
#include "dplb/support/atomic_histogram.hpp"

namespace dplb::balancer {

// How a prefix or affinity decision went: `taken` (the request went where its prefix or session is),
// `overridden` (it had a place, over the load bound, and the load policy decided instead), `missed`
// (prefix-aware only: no rank matched enough of its prompt).
struct routing_stats {
  explicit routing_stats(std::size_t rank_capacity);

  std::atomic<std::uint64_t> prefix_taken{0};
  std::atomic<std::uint64_t> prefix_overridden{0};
  std::atomic<std::uint64_t> prefix_missed{0};
  std::atomic<std::uint64_t> affinity_taken{0};
  std::atomic<std::uint64_t> affinity_overridden{0};
  // The longest matched prefix of each prefix-aware pick, in estimated tokens (0 when none matched).
  support::atomic_histogram matched_tokens;
  // Per rank, the prefix blocks the index holds for it.
  std::unique_ptr<std::atomic<std::uint64_t>[]> index_blocks;
  const std::size_t capacity;
};

// Consistent hashing with bounded loads' rule (Mirrokni, Thorup, Zadimoghaddam): a usable rank may take
// one more request while its in-flight count stays within `factor` times its fair share of all requests
// in flight over the usable ranks, this one included, rounded up: inflight + 1 <= ceil(factor * (total +
// 1) * weight / total weight). With factor C no rank ever holds more than about C times the average, and
// at C = 1.25 a burst onto idle ranks still fills each up to its share before any takes one more.
class load_bound {
 public:
  load_bound(std::span<const rank_view> ranks, double factor) : factor_(factor) {
    for (const auto& h : ranks) {
      if (!h.usable) continue;
      total_ += h.inflight;
      weights_ += h.weight;
    }
  }
  bool allows(const rank_view& h) const {
    // Less a hair before rounding up: a share meant to be a whole number (1.1 * 10 / 11) must not become
    // the next one through the rounding of its product (1.0000000000000002).
    return h.usable && weights_ > 0 &&
           h.inflight + 1.0 <= std::ceil(factor_ * (static_cast<double>(total_) + 1) * h.weight / weights_ - 1e-9);
  }

 private:
  double factor_;
  std::uint64_t total_ = 0;
  double weights_ = 0;
};

}  // namespace dplb::balancer
