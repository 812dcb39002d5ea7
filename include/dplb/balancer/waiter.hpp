#pragma once
// A request in dplb's queue (--max-inflight-per-rank): who it is for the queue's order (queue_share), what the
// queue keeps of it (waiter), and what became of it when it asked (wait_state).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>

#include "dplb/balancer/fair_order.hpp"
#include "dplb/balancer/policy.hpp"
#include "dplb/balancer/rank_lease.hpp"

namespace dplb::balancer {

// Who a queued request is, for its cluster's order and its tenant's queue limit.
struct queue_share {
  std::int64_t priority = 0;    // vLLM's `priority`: lower is served sooner
  std::uint64_t tenant = 0;     // a stable id of the tenant (0: the default tenant)
  std::uint32_t weight = 1;     // the tenant's share among equal priorities (0 is taken as 1)
  std::uint64_t cost = 1;       // what the request counts against that share: 1, or its tokens (0 is taken as 1)
  std::size_t max_queued = std::numeric_limits<std::size_t>::max();  // the tenant's waiters at most, this one included,
                                                                     // over every cluster's queue
  // A request whose rank failed before taking it, waiting for a slot on a rank it has not tried
  // (pick_context::avoid): it goes before every other waiter (it had its turn), and no queue limit refuses it.
  bool retry = false;
  // The longest the request itself may wait (its tenant's max_queue_wait_ms, say); 0: no bound of its own. It
  // holds out for its place (queue_limits::placement_wait) at most half of it, so that it takes a slot free
  // elsewhere well before its deadline rather than a refusal (balancer::placement_wait(share)).
  std::chrono::milliseconds max_wait{0};
};

// A request waiting for a slot. `deliver` is called with the lease from whichever thread freed the slot
// (or with an empty lease when the waiter can never be served: its rank, or every rank of its cluster, was
// removed; a retry's every untried rank went down), after the balancer's lock is released (so it may drop the
// lease, or call into the balancer); it should only hand the lease over (e.g. post it to the waiter's
// executor), since it delays that thread. `request` is kept with its views (chain, session key): their owner
// keeps them alive until the lease is delivered or cancel_wait() returned (a waiting session is suspended, so
// its storage stays put).
struct waiter {
  std::uint64_t id = 0;  // rising: a smaller id waited longer
  pick_context request;  // `avoid`: set for a retry only (queue_share::retry), the ranks it tried
  request_cost cost;
  std::chrono::steady_clock::time_point since{};
  std::function<void(rank_lease)> deliver;
  fair_tag tag;  // its place in its cluster's fair order, with `id`; see goes_before()
  // Until then a place of its own (its prefix's rank, its session's) holds it back from a slot elsewhere.
  std::chrono::steady_clock::time_point hold_until{};
  // In a preferring line: what its policy said of its place when it joined (policy::place), for placed().
  std::uint32_t place_matched_tokens = 0;

  bool goes_before(const waiter& other) const noexcept {
    return dplb::balancer::goes_before(tag, id, other.tag, other.id);
  }
};

// What acquire_or_wait() did with a request.
enum class wait_state {
  served,             // a slot at once
  queued,             // waits; its lease comes through `deliver`
  queue_full,         // refused: queue_limits::max_waiting waiters already
  tenant_queue_full,  // refused: its tenant has queue_share::max_queued waiters already
  no_usable_rank,     // refused: no rank of its cluster (pinned: its rank) is usable
};
struct wait_outcome {
  rank_lease lease;            // served: the slot
  wait_state state = wait_state::no_usable_rank;
  std::uint64_t waiter_id = 0; // queued: for cancel_wait
};

}  // namespace dplb::balancer
