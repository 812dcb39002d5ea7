#pragma once
// Shared by the queue tests written before the queue had an order other than arrival: acquire_or_wait() with
// the default queue_share (one tenant, one priority, weight 1, cost 1), under which the queue is FIFO, in the
// shape those tests read: the lease taken at once (empty if none), the waiter's id (0 unless queued) and
// whether it queued.

#include <cstdint>
#include <functional>
#include <utility>

#include "dplb/balancer/balancer.hpp"

namespace dplb::balancer::test {

inline rank_lease acquire_or_wait_fifo(balancer& b, const pick_context& request, request_cost cost,
                                       std::function<void(rank_lease)> deliver, std::uint64_t& waiter_id,
                                       bool& queued) {
  auto outcome = b.acquire_or_wait(request, cost, queue_share{}, std::move(deliver));
  waiter_id = outcome.waiter_id;
  queued = outcome.state == wait_state::queued;
  return std::move(outcome.lease);
}

}  // namespace dplb::balancer::test
