#pragma once
// Shared by the queue tests that watch the order in which waiters are served: each queued request with a
// label, the labels as served, and the slots they took, freed one at a time (each release serves the next
// waiter, which takes over that slot).

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "dplb/balancer/balancer.hpp"

namespace dplb::balancer::test {

inline pick_context in_cluster(std::size_t cluster) {
  pick_context request;
  request.cluster = cluster;
  return request;
}

struct served_log {
  explicit served_log(balancer& owner) : b(owner) {}
  // The waiters left are dropped first: a slot released as `held` goes would be delivered into it.
  ~served_log() { b.close(); }
  served_log(const served_log&) = delete;
  served_log& operator=(const served_log&) = delete;
  balancer& b;
  std::vector<std::string> order;  // labels, as served
  std::deque<rank_lease> held;     // the slots taken, oldest first

  std::uint64_t queue(const std::string& label, const queue_share& share, const pick_context& request = {}) {
    auto out = b.acquire_or_wait(request, {}, share, [this, label](rank_lease lease) {
      order.push_back(label);
      held.push_back(std::move(lease));
    });
    REQUIRE_FALSE(out.lease);
    REQUIRE(out.state == wait_state::queued);
    return out.waiter_id;
  }
  // Releases the slot held longest; the next waiter it suits takes it over.
  void release_one() {
    REQUIRE_FALSE(held.empty());
    auto lease = std::move(held.front());
    held.pop_front();
    lease.release();
  }
  void take(rank_lease lease) {
    REQUIRE(lease);
    held.push_back(std::move(lease));
  }
  // How many of the first `first_n` served have labels starting with `tenant_prefix`.
  std::size_t served(char tenant_prefix, std::size_t first_n) const {
    const auto end = order.begin() + static_cast<std::ptrdiff_t>(std::min(first_n, order.size()));
    return static_cast<std::size_t>(
        std::count_if(order.begin(), end, [&](const std::string& l) { return l.front() == tenant_prefix; }));
  }
};

}  // namespace dplb::balancer::test
