#pragma once
// The one shared truth of per-rank load. Every worker thread picks through the same balancer, so a
// burst is spread exactly even with several threads; there are no per-thread copies of the counts.
//
// Threading contract: every member may be called from any thread. acquire() holds a mutex for the
// policy's choice and the increment together (a pick and its count are one step, so two threads can
// never both see a rank as least loaded). Reads are lock-free atomics, and so are releases without
// queueing; with queueing a release takes the mutex, so that a freed slot can never miss a waiter
// (see balancer::release).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

class balancer;

// One request's claim on a rank: counted in-flight from acquire() until the lease is destroyed or
// released. Move-only RAII so that every exit path (normal end, client close, upstream error,
// exception) gives the slot back exactly once.
class rank_lease {
 public:
  rank_lease() = default;
  rank_lease(rank_lease&& other) noexcept;
  rank_lease& operator=(rank_lease&& other) noexcept;
  rank_lease(const rank_lease&) = delete;
  rank_lease& operator=(const rank_lease&) = delete;
  ~rank_lease() { release(); }

  explicit operator bool() const noexcept { return owner_ != nullptr; }
  std::size_t rank() const noexcept { return rank_; }
  void release() noexcept;

 private:
  friend class balancer;
  rank_lease(balancer* owner, std::size_t rank) noexcept : owner_(owner), rank_(rank) {}
  balancer* owner_ = nullptr;
  std::size_t rank_ = 0;
};

// Optional queueing in dplb (--max-inflight-per-rank): a rank at its limit takes no new request; when
// every usable rank is full, requests wait in a FIFO queue and each freed slot goes to the oldest waiter,
// so imbalance never hides in an engine's own queue.
struct queue_limits {
  std::uint32_t max_inflight_per_rank = 0;  // 0: no limit, no queueing
  std::size_t max_waiting = 1024;           // beyond: refused at once
};

// A request waiting for a slot. `deliver` is called with the lease from whichever thread freed the slot,
// after the balancer's lock is released (so it may drop the lease, or call into the balancer); it
// should only hand the lease over (e.g. post it to the waiter's executor), since it delays that thread.
struct waiter {
  std::uint64_t id = 0;
  std::function<void(rank_lease)> deliver;
};

class balancer {
 public:
  balancer(std::size_t rank_count, std::unique_ptr<policy> chosen_policy, queue_limits limits = {});

  // Chooses a rank and counts the request on it; an empty lease when no rank is usable.
  rank_lease acquire();
  // The same, never choosing a rank whose entry in `excluded` is true: a retry after a failure there.
  // A retry does not wait behind queued requests (it already had its turn).
  rank_lease acquire(const std::vector<bool>& excluded);

  // Marks a rank usable or not (health checks, ejection). In-flight requests on it are unaffected.
  void set_usable(std::size_t rank, bool usable);
  bool usable(std::size_t rank) const noexcept;

  std::size_t rank_count() const noexcept { return ranks_.size(); }
  std::uint32_t inflight(std::size_t rank) const noexcept;
  std::uint64_t picks(std::size_t rank) const noexcept;  // requests ever sent to the rank
  bool any_usable() const noexcept;

  // max - min in-flight over the usable ranks (0 when fewer than two are usable).
  std::uint32_t inflight_skew() const noexcept;

  const policy& active_policy() const noexcept { return *policy_; }

  // Hands a snapshot of every engine's reported load (indexed by rank) to the policy, under the pick
  // lock. Only the engine-stats baseline looks at it; dplb's own counts are never touched by it.
  void publish_engine_stats(std::span<const engine_load> snapshot);

  // Queueing (only with max_inflight_per_rank > 0).
  bool queueing() const noexcept { return limits_.max_inflight_per_rank > 0; }
  // Takes a slot at once (returned), or enqueues `deliver` (empty lease, queued = true), or refuses
  // when the queue is full or no rank is usable (empty lease, queued = false).
  rank_lease acquire_or_wait(std::function<void(rank_lease)> deliver, std::uint64_t& waiter_id, bool& queued);
  // Removes a waiter that gave up; false when it was already served (its lease is on the way).
  bool cancel_wait(std::uint64_t waiter_id);
  std::size_t waiting() const noexcept { return waiting_.load(std::memory_order_relaxed); }
  // For shutdown, once the threads that serve the waiters have stopped: drops every waiter without
  // delivering to it (destroying its `deliver`) and queues none from then on, so that no release after
  // this calls a `deliver`, whose executor may be destroyed by then.
  void close();

 private:
  friend class rank_lease;
  void release(std::size_t rank) noexcept;
  std::optional<std::size_t> pick_locked(const std::vector<bool>* excluded);
  // A waiter's slot, assigned under the lock, handed over after it.
  struct delivery {
    std::function<void(rank_lease)> deliver;
    rank_lease lease;
  };
  void serve_waiters_locked(std::vector<delivery>& ready);
  static void deliver(std::vector<delivery>& ready) noexcept;

  // A cache line per rank: each rank's count is written by every request on it, and ranks side by side
  // on one line would make the threads serving different ranks invalidate each other's reads.
  struct alignas(64) rank_state {
    std::atomic<std::uint32_t> inflight{0};
    std::atomic<std::uint64_t> picks{0};
    std::atomic<bool> usable{true};
  };

  mutable std::mutex pick_mutex_;
  std::unique_ptr<policy> policy_;
  queue_limits limits_;
  std::deque<waiter> queue_;               // guarded by pick_mutex_
  std::atomic<std::size_t> waiting_{0};    // queue_.size() for metrics; never decides anything
  std::uint64_t next_waiter_id_ = 1;       // guarded by pick_mutex_
  bool closed_ = false;                    // guarded by pick_mutex_
  std::vector<rank_state> ranks_;  // sized once; never resized (atomics are not movable)
  std::vector<rank_view> view_;    // scratch for choose(); guarded by pick_mutex_
};

}  // namespace dplb::balancer
