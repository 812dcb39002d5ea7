// The balancer's queue (with queue_limits::max_inflight_per_rank): who waits, in which line, and who gets a
// freed slot. The discipline is described in balancer.hpp, above queue_limits; balancer.cpp has the picks, the
// ranks' state and the releases that call into it.
#include "dplb/balancer/balancer.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

namespace dplb::balancer {

namespace {

// The fair order's band of retries: before every other (a client's priority of this value is taken as the
// next one).
constexpr std::int64_t retry_band = std::numeric_limits<std::int64_t>::min();

}  // namespace

// Where a waiter belongs, judged as if no rank were full: its session's own rank on the ring (not the next
// one, which it reaches only when its own is over the load bound), else what its policy prefers. nullopt:
// any slot of its cluster suits it, and so it does once its placement_wait is over (nobody starves).
std::optional<std::size_t> balancer::preferred_locked(const pick_context& request, clock::time_point since,
                                                      clock::time_point now) {
  if (now - since >= limits_.placement_wait || request.cluster >= policies_.size()) return std::nullopt;
  refresh_view_locked(request, false);
  std::optional<std::size_t> place;
  if (affinity_ && !request.session_key.empty()) {
    // As in the pick, a session key leaves the policy out.
    const load_bound bound(view_, affinity_bound_);
    const auto placed = affinity_->place(request.session_key, view_, [&](const rank_view& h) { return bound.allows(h); });
    if (placed && !placed->moved) place = placed->rank;
  } else {
    place = policies_[request.cluster]->preferred(request, view_);
  }
  if (place && (*place >= view_.size() || !view_[*place].usable)) place.reset();
  return place;
}

std::size_t balancer::queued_locked() const noexcept {
  std::size_t n = 0;
  for (const auto& q : queues_) n += q.size();
  for (const auto& d : detail_) n += d.pinned.size() + d.preferring.size();
  return n;
}

void balancer::count_waiting_locked() noexcept { waiting_.store(queued_locked(), std::memory_order_relaxed); }

// Why a request that got no slot may not queue either.
wait_state balancer::refusal_locked(const pick_context& request, const queue_share& share) const {
  const auto pinned = request.pinned_rank;
  if (!(pinned ? usable(*pinned) : any_usable(request.cluster))) return wait_state::no_usable_rank;
  if (!queueing() || closed_) return wait_state::queue_full;
  if (share.retry) return untried_usable_locked(request) ? wait_state::queued : wait_state::no_usable_rank;
  if (waiting_of_locked(share.tenant) >= share.max_queued) return wait_state::tenant_queue_full;
  if (waiting_.load(std::memory_order_relaxed) >= limits_.max_waiting) return wait_state::queue_full;
  return wait_state::queued;
}

wait_outcome balancer::acquire_or_wait(const pick_context& request, request_cost cost, const queue_share& share,
                                       std::function<void(rank_lease)> deliver) {
  cost = at_least_one_token(cost);
  std::vector<delivery> ready;  // declared first: any lease left in it is released after the unlock
  wait_outcome out;
  {
    std::lock_guard lock(pick_mutex_);
    const auto pinned = request.pinned_rank;
    if (pinned ? *pinned >= detail_.size() : request.cluster >= queues_.size()) return out;
    // A waiter whose placement_wait ran out since the last event may now take a slot that suits it: it
    // goes before this request.
    if (queueing()) serve_waiters_locked(ready);
    const auto now = clock::now();
    std::deque<waiter>* line = nullptr;
    bool now_or_queue = true;  // it may take a slot at once, if its line is empty (no jumping the queue)
    if (pinned) {
      line = &detail_[*pinned].pinned;
    } else if (const auto place = queueing() && !share.retry ? preferred_locked(request, now, now) : std::nullopt;
               place && !has_room_locked(*place)) {
      line = &detail_[*place].preferring;  // its rank is full: it holds out for that rank's next slot
      now_or_queue = false;
    } else {
      line = &queues_[request.cluster];
    }
    const bool shared_line = line == &queues_[request.cluster];
    // A non-empty line has no room for it (the invariant at release()), whatever its priority; a retry
    // comes before its every waiter.
    if (now_or_queue && (line->empty() || share.retry)) {
      const auto chosen = shared_line ? pick_from_shared_line_locked(request, cost, now, now) : pick_locked(request, cost);
      if (chosen) out.lease = rank_lease(this, *chosen, cost);
    }
    if (!out.lease) out.state = refusal_locked(request, share);
    if (out.state == wait_state::queued) {
      out.waiter_id = next_waiter_id_++;
      waiter w{out.waiter_id, request, cost, now, std::move(deliver),
               orders_[pinned ? ranks_[*pinned].cluster : request.cluster].enqueue(share.retry ? retry_band : std::max(share.priority, retry_band + 1), share.tenant,
                              share.weight, share.cost)};
      if (!share.retry) w.request.avoid = nullptr;
      insert_by_key(*line, std::move(w));
      // The line may hold waiters set aside for the room there (long prompts, retries: see
      // serve_waiters_locked): the newcomer may suit that room.
      if (shared_line && cluster_has_room_locked(request.cluster)) {
        serve_waiters_locked(ready);
      }
      count_waiting_locked();
    } else if (!out.lease && out.state != wait_state::no_usable_rank &&
               (now_or_queue ? line->empty() || shared_line : queues_[request.cluster].empty())) {
      // It would have held out for its full rank, or passed over a rank still prefilling a long prompt, or
      // found its line holding only waiters set aside for the room there (the serve above left it to them),
      // but cannot wait (the queue or its tenant's share of it is full, or it is closing): a slot beats a
      // refusal, as it would for a request with no place.
      if (const auto chosen = pick_locked(request, cost)) out.lease = rank_lease(this, *chosen, cost);
    }
    if (out.lease) out.state = wait_state::served;
  }
  balancer::deliver(ready);  // (the parameter `deliver` hides the member)
  return out;
}

bool balancer::cancel_wait(std::uint64_t waiter_id) {
  std::vector<delivery> ready;  // declared first: any lease left in it is released after the unlock
  std::unique_lock lock(pick_mutex_);
  const auto erase_from = [&](std::deque<waiter>& line) {
    auto it = std::find_if(line.begin(), line.end(), [&](const waiter& w) { return w.id == waiter_id; });
    if (it == line.end()) return false;
    order_of(*it).abandoned(it->tag);
    line.erase(it);
    return true;
  };
  bool found = false;
  for (auto& q : queues_) found = found || erase_from(q);
  for (auto& d : detail_) found = found || erase_from(d.pinned) || erase_from(d.preferring);
  if (found) {
    count_waiting_locked();
    // The waiter that left may have been a line's head holding out for its full rank: the one behind it
    // may suit a slot free elsewhere now.
    if (queueing()) serve_waiters_locked(ready);
  }
  lock.unlock();
  deliver(ready);
  return found;
}

void balancer::reconsider() {
  std::vector<delivery> ready;
  {
    std::lock_guard lock(pick_mutex_);
    if (queueing()) serve_waiters_locked(ready);
  }
  deliver(ready);
}

void balancer::close() {
  std::deque<waiter> dropped;  // destroyed after the unlock: a waiter's closure may own anything
  std::lock_guard lock(pick_mutex_);
  closed_ = true;
  for (auto& q : queues_) {
    for (auto& w : q) dropped.push_back(std::move(w));
    q.clear();
  }
  for (auto& d : detail_) {
    for (auto* line : {&d.pinned, &d.preferring}) {
      for (auto& w : *line) dropped.push_back(std::move(w));
      line->clear();
    }
  }
  for (auto& order : orders_) order.clear();
  waiting_.store(0, std::memory_order_relaxed);
}

std::size_t balancer::waiting_of(std::uint64_t tenant) const {
  std::lock_guard lock(pick_mutex_);
  return waiting_of_locked(tenant);
}

std::size_t balancer::waiting_of_locked(std::uint64_t tenant) const {
  std::size_t n = 0;
  for (const auto& order : orders_) n += order.waiting_of(tenant);
  return n;
}

std::size_t balancer::queue_bands() const {
  std::lock_guard lock(pick_mutex_);
  std::size_t n = 0;
  for (const auto& order : orders_) n += order.bands();
  return n;
}

// Every line is kept soonest first; a new waiter may go ahead of older ones (a lower priority value, or a
// tenant that is behind its share).
void balancer::insert_by_key(std::deque<waiter>& line, waiter w) {
  const auto at =
      std::upper_bound(line.begin(), line.end(), w, [](const waiter& a, const waiter& b) { return a.goes_before(b); });
  line.insert(at, std::move(w));
}

// Serves waiters soonest first, by their keys (the discipline is in balancer.hpp, above queue_limits).
// There are three kinds of lines, each soonest first: a cluster's shared line, a rank's pinned line and a
// rank's line of waiters whose place it is (`preferring`). Each round takes the line whose head comes
// soonest among those not yet known to be stuck, and the head then:
//  - pinned: takes its rank's slot if the rank is usable and has room, else its line is stuck;
//  - otherwise: if no rank of its cluster has room, its line is stuck (and so is the cluster, for this
//    call: serving only fills ranks). Else its place is judged afresh (the load and the prefix index
//    moved since it queued, and its placement_wait may be over): a place on a full rank sends it to that
//    rank's line, where it waits (if it already is there, that line is stuck); a place with room, or no
//    place, re-runs the whole pick for it, which takes a slot with room.
// A stuck line stays stuck for the rest of the call, since the rounds only take slots. The rounds end:
// each one serves a waiter, marks a line stuck or moves a waiter to the line of its place, and a moved
// waiter is judged on the same state at its new line's head (nothing changed but the moves), where it
// stays. Only heads are judged. In a shared line that is exact: any waiter there takes any slot of its
// cluster, the head first. In a pinned line every waiter wants the same rank. In a rank's preferring line
// every waiter has the same place, but the head is the soonest, not always the oldest: a waiter behind it
// whose placement_wait ran out (or that tied two ranks on its prefix) would take a slot free elsewhere, yet
// waits while the head holds out, at most until the head's own placement_wait is over or the head is served
// (and then behind any sooner waiter that joined the line meanwhile: by priority, or within a priority by
// the fair order, which lets only so many go ahead of it). One exception in a shared line: a head that the
// room there does not suit (a long prompt passing over ranks still prefilling one, see
// pick_from_shared_line_locked; a retry whose untried ranks are full) is set aside for the call, so that
// those behind it may take that room, and put back in its place at the end.
void balancer::serve_waiters_locked(std::vector<delivery>& ready) {
  if (waiting_.load(std::memory_order_relaxed) == 0) return;  // exact under the lock
  const std::size_t clusters = queues_.size();
  const std::size_t ranks = detail_.size();
  blocked_.assign(clusters + 2 * ranks, 0);  // capacity kept: no allocation per release
  cluster_full_.assign(clusters, 0);
  const auto now = clock::now();
  for (;;) {
    std::deque<waiter>* line = nullptr;
    std::size_t slot = 0;  // the line's flag in blocked_: shared lines, then pinned, then preferring
    const auto consider = [&](std::deque<waiter>& candidate, std::size_t flag) {
      if (candidate.empty() || blocked_[flag]) return;
      if (!line || candidate.front().goes_before(line->front())) {
        line = &candidate;
        slot = flag;
      }
    };
    for (std::size_t c = 0; c < clusters; ++c) consider(queues_[c], c);
    for (std::size_t r = 0; r < ranks; ++r) {
      consider(detail_[r].pinned, clusters + r);
      consider(detail_[r].preferring, clusters + ranks + r);
    }
    if (!line) break;
    auto& head = line->front();
    if (!head.request.pinned_rank) {
      const std::size_t cluster = head.request.cluster;
      if (cluster_full_[cluster] || !cluster_has_room_locked(cluster)) {
        cluster_full_[cluster] = 1;
        blocked_[slot] = 1;
        continue;
      }
      // (A retry has no place: it takes the first slot of a rank it has not tried.)
      if (const auto place = head.request.avoid ? std::nullopt : preferred_locked(head.request, head.since, now);
          place && !has_room_locked(*place)) {
        auto& own = detail_[*place].preferring;
        if (line == &own) {
          blocked_[slot] = 1;
        } else {
          insert_by_key(own, std::move(head));
          line->pop_front();
        }
        continue;
      }
    }
    // A pinned head's pick checks its rank; any other's takes a rank with room (there is one), unless it
    // is a long prompt from a shared line that passes over that room. (Room for its delivery first: a lease
    // dropped by a push_back that throws would release itself under this lock.)
    if (ready.size() == ready.capacity()) ready.reserve(std::max<std::size_t>(4, 2 * ready.size()));
    const bool shared_line = slot < clusters;
    if (const auto chosen = shared_line ? pick_from_shared_line_locked(head.request, head.cost, head.since, now)
                                        : pick_locked(head.request, head.cost)) {
      ready.push_back(delivery{std::move(head.deliver), rank_lease(this, *chosen, head.cost)});
      order_of(head).served(head.tag);
      line->pop_front();
    } else if (shared_line && head.request.avoid && !untried_usable_locked(head.request)) {
      order_of(head).abandoned(head.tag);  // a retry with no rank left to try: refused now, not at its queue timeout
      ready.push_back(delivery{std::move(head.deliver), rank_lease{}});
      line->pop_front();
    } else if (shared_line && (spreads(head.request) || head.request.avoid)) {
      set_aside_.push_back(std::move(head));  // back in its place below; the room may suit those behind it
      line->pop_front();
    } else {
      blocked_[slot] = 1;
    }
  }
  for (auto& w : set_aside_) insert_by_key(queues_[w.request.cluster], std::move(w));
  set_aside_.clear();
  count_waiting_locked();
}

// Whether some usable rank of the request's cluster is not one it tried (pick_context::avoid).
bool balancer::untried_usable_locked(const pick_context& request) const noexcept {
  for (std::size_t r = 0; r < detail_.size(); ++r) {
    const bool tried = request.avoid && r < request.avoid->size() && (*request.avoid)[r];
    if (!tried && ranks_[r].cluster == request.cluster && ranks_[r].flags.load(std::memory_order_relaxed) == 0) {
      return true;
    }
  }
  return false;
}

// The pick for a request of a cluster's shared line: a long prompt (queue_limits::long_prompt_tokens) passes
// over the ranks still prefilling one while some other usable rank of its cluster is not, for at most
// long_prompt_hold since it came; nullopt when the room is only there (or nowhere). Any other request's pick
// is the plain one.
std::optional<std::size_t> balancer::pick_from_shared_line_locked(const pick_context& request, request_cost& cost,
                                                                  clock::time_point since, clock::time_point now) {
  if (!spreads(request) || now - since >= limits_.long_prompt_hold) return pick_locked(request, cost);
  const std::size_t ranks = detail_.size();
  passed_over_.assign(ranks, false);  // capacity kept
  bool prefilling = false;
  bool idle = false;  // some usable rank of its cluster is prefilling no long prompt
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto& state = ranks_[r];
    if (state.cluster != request.cluster || state.flags.load(std::memory_order_relaxed) != 0) continue;
    const bool busy = state.long_prefills.load(std::memory_order_relaxed) > 0;
    passed_over_[r] = busy;
    (busy ? prefilling : idle) = true;
  }
  if (!prefilling || !idle || request.avoid) return pick_locked(request, cost);
  pick_context narrowed = request;
  narrowed.avoid = &passed_over_;
  return pick_locked(narrowed, cost);
}

// After the lock is released: a delivery that drops its lease releases it, which takes the lock again
// (and may serve the next waiter, delivering from inside this call). The slots were assigned in the
// queue's order under the lock; only the hand-over happens here. A hand-over that throws (a post that cannot
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

// A removed rank never comes back on its own (health, ejection and drains do): its pinned waiters, and the
// queue of a cluster left with no rank at all, would wait for nothing until their queue timeout. Each gets
// an empty lease now: refused at once. Those whose place it was join their cluster's line: they take any
// of its slots.
void balancer::turn_away_stranded_locked(std::size_t rank, std::vector<delivery>& ready) {
  const auto turn_away = [&](std::deque<waiter>& line) {
    for (auto& w : line) {
      order_of(w).abandoned(w.tag);
      ready.push_back(delivery{std::move(w.deliver), rank_lease{}});
    }
    line.clear();
  };
  turn_away(detail_[rank].pinned);
  const std::size_t cluster = ranks_[rank].cluster;
  for (auto& w : detail_[rank].preferring) insert_by_key(queues_[cluster], std::move(w));
  detail_[rank].preferring.clear();
  const bool cluster_left = std::ranges::any_of(ranks_in_use(), [cluster](const rank_state& r) {
    return r.cluster == cluster && (r.flags.load(std::memory_order_relaxed) & rank_flag::removed) == 0;
  });
  if (!cluster_left) turn_away(queues_[cluster]);
  count_waiting_locked();
}

}  // namespace dplb::balancer
