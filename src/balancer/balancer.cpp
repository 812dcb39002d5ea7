#include "dplb/balancer/balancer.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <utility>

namespace dplb::balancer {

rank_lease::rank_lease(rank_lease&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), rank_(other.rank_) {}

rank_lease& rank_lease::operator=(rank_lease&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    rank_ = other.rank_;
  }
  return *this;
}

void rank_lease::release() noexcept {
  if (auto* owner = std::exchange(owner_, nullptr)) owner->release(rank_);
}

balancer::balancer(std::size_t rank_count, std::unique_ptr<policy> chosen_policy, queue_limits limits)
    : policy_(std::move(chosen_policy)), limits_(limits), ranks_(rank_count), view_(rank_count) {
  if (rank_count == 0) throw std::invalid_argument("balancer needs at least one rank");
  if (!policy_) throw std::invalid_argument("balancer needs a policy");
}

rank_lease balancer::acquire() {
  std::lock_guard lock(pick_mutex_);
  if (!queue_.empty()) return {};  // no jumping the queue
  const auto chosen = pick_locked(nullptr);
  return chosen ? rank_lease(this, *chosen) : rank_lease{};
}

std::optional<std::size_t> balancer::pick_locked(const std::vector<bool>* excluded) {
  const auto cap = limits_.max_inflight_per_rank;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    view_[i].inflight = ranks_[i].inflight.load(std::memory_order_relaxed);
    view_[i].usable = ranks_[i].usable.load(std::memory_order_relaxed) &&
                      !(excluded && i < excluded->size() && (*excluded)[i]) && (cap == 0 || view_[i].inflight < cap);
  }
  const auto chosen = policy_->choose(view_);
  if (!chosen || *chosen >= ranks_.size()) return std::nullopt;
  // Incremented while the lock is held: the next pick, on any thread, already sees this request.
  ranks_[*chosen].inflight.fetch_add(1, std::memory_order_relaxed);
  ranks_[*chosen].picks.fetch_add(1, std::memory_order_relaxed);
  return chosen;
}

void balancer::publish_engine_stats(std::span<const engine_load> snapshot) {
  std::lock_guard lock(pick_mutex_);
  policy_->on_engine_stats(snapshot);
}

rank_lease balancer::acquire(const std::vector<bool>& excluded) {
  // A retry: it already had its turn (its first rank failed), so it does not queue again.
  std::lock_guard lock(pick_mutex_);
  const auto chosen = pick_locked(&excluded);
  return chosen ? rank_lease(this, *chosen) : rank_lease{};
}

rank_lease balancer::acquire_or_wait(std::function<void(rank_lease)> deliver, std::uint64_t& waiter_id,
                                     bool& queued) {
  std::lock_guard lock(pick_mutex_);
  queued = false;
  if (queue_.empty()) {
    if (const auto chosen = pick_locked(nullptr)) return rank_lease(this, *chosen);
  }
  const bool any = std::any_of(ranks_.begin(), ranks_.end(),
                               [](const rank_state& r) { return r.usable.load(std::memory_order_relaxed); });
  if (!queueing() || closed_ || !any || queue_.size() >= limits_.max_waiting) return {};
  waiter_id = next_waiter_id_++;
  queue_.push_back(waiter{waiter_id, std::move(deliver)});
  waiting_.store(queue_.size(), std::memory_order_relaxed);
  queued = true;
  return {};
}

bool balancer::cancel_wait(std::uint64_t waiter_id) {
  std::lock_guard lock(pick_mutex_);
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const waiter& w) { return w.id == waiter_id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  waiting_.store(queue_.size(), std::memory_order_relaxed);
  return true;
}

void balancer::close() {
  std::deque<waiter> dropped;  // destroyed after the unlock: a waiter's closure may own anything
  std::lock_guard lock(pick_mutex_);
  closed_ = true;
  dropped.swap(queue_);
  waiting_.store(0, std::memory_order_relaxed);
}

void balancer::serve_waiters_locked(std::vector<delivery>& ready) {
  while (!queue_.empty()) {
    const auto chosen = pick_locked(nullptr);
    if (!chosen) break;
    ready.push_back(delivery{std::move(queue_.front().deliver), rank_lease(this, *chosen)});
    queue_.pop_front();
    waiting_.store(queue_.size(), std::memory_order_relaxed);
  }
}

// After the lock is released: a delivery that drops its lease releases it, which takes the lock again
// (and may serve the next waiter, delivering from inside this call). The slots were assigned in FIFO
// order under the lock; only the hand-over happens here. A hand-over that throws (a post that cannot
// allocate) releases the lease it was given as the exception leaves it, which may serve the next
// waiter; its own waiter is answered by its queue timeout. The others are still handed their slots:
// one failure must neither end the process (this runs inside release(), which is noexcept) nor strand them.
void balancer::deliver(std::vector<delivery>& ready) noexcept {
  for (auto& d : ready) {
    try {
      d.deliver(std::move(d.lease));
    } catch (...) {
    }
  }
}

// No freed slot may leave a waiter behind. A waiter is enqueued under pick_mutex_ after its pick, in
// the same critical section, found no rank with room; so with queueing on, every step that can give a
// waiter room (a release, a rank becoming usable) changes the state and serves the queue in one
// critical section under that same mutex. The mutex orders the two: if the enqueue comes first, the
// freeing step finds the waiter and serves it; if the freeing step comes first, the enqueuer's pick sees
// the room and takes it instead of queueing. Hence the invariant, at every unlock: the queue is empty or
// no rank has room. (Checking a waiter count outside the lock after a relaxed decrement, as a cheaper
// release would, misses the enqueuer that has picked but not yet published itself.)
// Without queueing nothing ever waits, and a release stays one lock-free decrement.
void balancer::release(std::size_t rank) noexcept {
  if (!queueing()) {
    ranks_[rank].inflight.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  std::vector<delivery> ready;  // declared first: any lease left in it is released after the unlock
  {
    std::lock_guard lock(pick_mutex_);
    ranks_[rank].inflight.fetch_sub(1, std::memory_order_relaxed);
    serve_waiters_locked(ready);
  }
  deliver(ready);
}

void balancer::set_usable(std::size_t rank, bool usable) {
  if (!usable || !queueing()) {
    // Taking a rank out gives no waiter room; and without queueing there are no waiters.
    ranks_.at(rank).usable.store(usable, std::memory_order_relaxed);
    return;
  }
  std::vector<delivery> ready;
  {
    std::lock_guard lock(pick_mutex_);
    ranks_.at(rank).usable.store(true, std::memory_order_relaxed);
    serve_waiters_locked(ready);
  }
  deliver(ready);
}

bool balancer::usable(std::size_t rank) const noexcept {
  return ranks_[rank].usable.load(std::memory_order_relaxed);
}

std::uint32_t balancer::inflight(std::size_t rank) const noexcept {
  return ranks_[rank].inflight.load(std::memory_order_relaxed);
}

std::uint64_t balancer::picks(std::size_t rank) const noexcept {
  return ranks_[rank].picks.load(std::memory_order_relaxed);
}

bool balancer::any_usable() const noexcept {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const rank_state& r) { return r.usable.load(std::memory_order_relaxed); });
}

std::uint32_t balancer::inflight_skew() const noexcept {
  std::uint32_t lo = std::numeric_limits<std::uint32_t>::max();
  std::uint32_t hi = 0;
  std::size_t usable_count = 0;
  for (const auto& r : ranks_) {
    if (!r.usable.load(std::memory_order_relaxed)) continue;
    const auto n = r.inflight.load(std::memory_order_relaxed);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
    ++usable_count;
  }
  return usable_count < 2 ? 0 : hi - lo;
}

}  // namespace dplb::balancer
