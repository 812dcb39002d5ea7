#pragma once
// Shared by the queue tests that watch what each waiter is handed: waiters numbered in the order they queued,
// and what was delivered to each (an empty lease: turned away).

#include <catch2/catch.hpp>

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "dplb/balancer/balancer.hpp"

namespace dplb::balancer::test {

struct recorded_waiters {
  explicit recorded_waiters(balancer& owner) : b(owner) {}
  // Drops the waiters left before the leases go: a lease released here must not deliver into `delivered`
  // while it is being destroyed.
  ~recorded_waiters() { b.close(); }
  recorded_waiters(const recorded_waiters&) = delete;
  recorded_waiters& operator=(const recorded_waiters&) = delete;

  balancer& b;
  std::vector<std::pair<std::size_t, rank_lease>> delivered;
  std::size_t count = 0;

  // The request, as the next waiter (numbered `count` before the call), whatever acquire_or_wait() did with it.
  wait_outcome queue(const pick_context& request, const queue_share& share = {}) {
    const std::size_t index = count++;
    return b.acquire_or_wait(request, {}, share,
                             [this, index](rank_lease l) { delivered.emplace_back(index, std::move(l)); });
  }
  // The same, for a request that must queue: its number.
  std::size_t queued(const pick_context& request, const queue_share& share = {}) {
    const std::size_t index = count;
    REQUIRE(queue(request, share).state == wait_state::queued);
    return index;
  }
  std::optional<std::size_t> rank_of(std::size_t waiter) const {
    for (const auto& [w, lease] : delivered) {
      if (w == waiter && lease) return lease.rank();
    }
    return std::nullopt;
  }
  bool turned_away(std::size_t waiter) const {
    for (const auto& [w, lease] : delivered) {
      if (w == waiter) return !lease;
    }
    return false;
  }
};

}  // namespace dplb::balancer::test
