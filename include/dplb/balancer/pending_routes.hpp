#pragma once
// What the engines' KV-cache events cannot show yet: the prompts prefix-aware placed by load a moment ago.
// An engine announces a block only once a step has computed it, so between a pick and its prefill (queueing
// included) the events say nothing of a prompt dplb has just sent; without a memory of it, the next requests
// of the same group would match nowhere and scatter over the ranks, each paying the whole prefill (measured:
// twice the misses at high load). A route placed by load is remembered here, block by block (the first
// `max_blocks` of its chain), for `ttl`; a request that matches nothing in the events is matched here
// instead. Picks made on the events' evidence are not remembered: the events speak for them, and a removal
// they report then takes effect at once.
//
// Bounded: at most `capacity` blocks in all; the oldest remembered go first. Not thread-safe: the policy that
// owns it runs under the balancer's lock.

#include <boost/unordered/unordered_flat_map.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace dplb::balancer {

class pending_routes {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t max_blocks = 256;  // 4,096 tokens of 16: enough to tell groups apart

  pending_routes(std::chrono::milliseconds ttl, std::size_t capacity) : ttl_(ttl), capacity_(capacity) {}

  // The request's chain went to `rank` at `now`.
  void remember(std::size_t rank, std::span<const std::uint64_t> chain, clock::time_point now);
  // matched[r] = the leading blocks of `chain` routed to rank r within the ttl (the latest route of each block
  // counts); `matched` is resized to `ranks`.
  void match(std::span<const std::uint64_t> chain, std::size_t ranks, clock::time_point now,
             std::vector<std::uint32_t>& matched) const;
  // Forgets every route to `rank` (it was removed).
  void forget(std::size_t rank);
  std::size_t size() const { return routes_.size(); }

 private:
  struct route {
    std::uint32_t rank;
    clock::time_point until;
  };
  void expire(clock::time_point now);

  const std::chrono::milliseconds ttl_;
  const std::size_t capacity_;
  boost::unordered_flat_map<std::uint64_t, route> routes_;
  // Blocks in the order remembered, with when: the front expires or is dropped first. A block remembered
  // again has a newer entry; the older one finds the map's `until` later than its own and leaves it.
  std::deque<std::pair<std::uint64_t, clock::time_point>> order_;
};

}  // namespace dplb::balancer
