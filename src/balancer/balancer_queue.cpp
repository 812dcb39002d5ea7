// The balancer's queue (with queue_limits::max_inflight_per_rank): who waits, in which line, and who gets a
// freed slot. Its parts and their rules are in queue_lines.hpp; balancer.cpp has the picks, the ranks' state
// and the releases that call into it.
#include "dplb/balancer/balancer.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>
#include <utility>

namespace dplb::balancer {

namespace {

// The fair order's band of retries: before every other (a client's priority of this value is taken as the
// next one).
constexpr std::int64_t retry_band = std::numeric_limits<std::int64_t>::min();

thread_local int handoff_room_failure_in = -1;  // fail_handoff_room_after(): make_room() calls left before one fails

}  // namespace

void fail_handoff_room_after(int n) noexcept { handoff_room_failure_in = n; }

void handoffs::make_room() {
  if (handoff_room_failure_in >= 0 && handoff_room_failure_in-- == 0) throw std::bad_alloc();
  if (items_.size() == items_.capacity()) items_.reserve(std::max<std::size_t>(4, 2 * items_.size()));
}

// After the lock is released: a hand-over that drops its lease releases it, which takes the lock again (and may
// serve the next waiter, handing over from inside this call). The slots were assigned in the queue's order
// under the lock; only the hand-over happens here.
void handoffs::hand_over() noexcept {
  for (auto& d : items_) {
    try {
      d.deliver(std::move(d.lease));
    } catch (...) {
    }
  }
  items_.clear();
}

std::chrono::milliseconds balancer::placement_wait(const queue_share& share) const noexcept {
  if (share.max_wait.count() <= 0) return limits_.placement_wait;
  return std::min(limits_.placement_wait, share.max_wait / 2);
}

// Where a waiter belongs, judged as if no rank were full: its session's own rank on the ring (not the next
// one, which it reaches only when its own is over the load bound), else what its policy prefers. nullopt:
// any slot of its cluster suits it, and so it does once its hold is over (nobody starves for a place).
std::optional<place> balancer::preferred_locked(const pick_context& request, clock::time_point hold_until,
                                                clock::time_point now) {
  if (now >= hold_until || request.cluster >= policies_.size()) return std::nullopt;
  refresh_view_locked(request, false);
  std::optional<place> at;
  if (affinity_ && !request.session_key.empty()) {
    // As in the pick, a session key leaves the policy out.
    const load_bound bound(view_, affinity_bound_);
    const auto placed = affinity_->place(request.session_key, view_, [&](const rank_view& h) { return bound.allows(h); });
    if (placed && !placed->moved) at = place{placed->rank};
  } else {
    at = policies_[request.cluster]->preferred(request, view_);
  }
  if (at && (at->rank >= view_.size() || !view_[at->rank].usable)) at.reset();
  return at;
}

// Its place was judged when it joined the rank's line, and stays judged while it waits there: the line is given
// up when the rank goes out (give_up_places_on_locked) and left when its hold ends (end_holds_locked). So the
// rank's freed slot is its own without a pick, which would read every rank of the cluster (twice: its place
// again, then the policy's choice): serving a waiter at its place costs O(log n) in ranks, not O(n).
// The policy hears of it first: placed() may allocate (an index entry), and if it throws, nothing is counted
// (serve_locked leaves the waiter in its line).
void balancer::take_place_locked(std::size_t rank, waiter& w) {
  if (affinity_ && !w.request.session_key.empty()) {
    if (routing_stats_) routing_stats_->affinity_taken.fetch_add(1, std::memory_order_relaxed);
  } else {
    policies_[ranks_[rank].cluster]->placed(w.request, place{rank, w.place_matched_tokens});
  }
  count_pick_locked(rank, w.request, w.cost);
}

std::size_t balancer::waiting_of_locked(std::uint64_t tenant) const {
  std::size_t n = 0;
  for (const auto& queue : clusters_) n += queue.order.waiting_of(tenant);
  return n;
}

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

waiting_line& balancer::line_locked(const line_ref& line) noexcept {
  switch (line.kind) {
    case line_kind::pinned: return detail_[line.index].pinned;
    case line_kind::preferring: return detail_[line.index].preferring;
    case line_kind::shared: break;
  }
  return clusters_[line.index].shared;
}

// Everything that can fail (the tag's band, the node, the index entries) happens before the waiter joins its
// line; what is done is undone if a later step throws, so a failed enqueue leaves the queue as it was.
void balancer::enqueue_locked(waiter w, const line_ref& line, std::size_t cluster, const queue_share& share) {
  auto& queue = clusters_[cluster];
  w.tag = queue.order.enqueue(share.retry ? retry_band : std::max(share.priority, retry_band + 1), share.tenant,
                              share.weight, share.cost);
  const auto tag = w.tag;
  const auto id = w.id;
  const auto hold = std::make_pair(w.hold_until, w.id);
  const bool may_hold = !share.retry && !w.request.pinned_rank && w.hold_until > w.since;
  try {
    auto node = waiting_line::make_node(std::move(w));
    places_.emplace(id, waiter_place{cluster, line, node.key()});
    try {
      if (may_hold) queue.holds.insert(hold);
    } catch (...) {
      places_.erase(id);
      throw;
    }
    line_locked(line).put(std::move(node));
  } catch (...) {
    queue.order.abandoned(tag);
    throw;
  }
  ++queue.waiting;
}

// Takes the waiter out of its line and out of the queue's indexes (it was served, turned away or gave up: the
// caller told its fair order which).
waiting_line::node balancer::leave_locked(cluster_queue& queue, waiting_line& line, waiting_line::iterator at) {
  const auto& w = at->second;
  queue.holds.erase({w.hold_until, w.id});
  places_.erase(w.id);
  --queue.waiting;
  return line.take(at);
}

void balancer::move_locked(waiting_line& from, waiting_line::iterator at, const line_ref& to) {
  places_.find(at->second.id)->second.line = to;
  line_locked(to).put(from.take(at));
}

// Waiters whose hold ended stand in the shared line from now on: any slot of their cluster suits them.
void balancer::end_holds_locked(cluster_queue& queue, clock::time_point now) {
  while (!queue.holds.empty() && queue.holds.begin()->first <= now) {
    const auto id = queue.holds.begin()->second;
    queue.holds.erase(queue.holds.begin());
    auto& place = places_.find(id)->second;
    if (place.line.kind != line_kind::preferring) continue;
    auto& from = detail_[place.line.index].preferring;
    move_locked(from, from.find(place.key), line_ref{line_kind::shared, place.cluster});
  }
}

// The rank became unusable: a place there no longer counts.
void balancer::give_up_places_on_locked(std::size_t rank) {
  auto& line = detail_[rank].preferring;
  const line_ref shared{line_kind::shared, ranks_[rank].cluster};
  while (!line.empty()) move_locked(line, line.begin(), shared);
}

// Retries stand first in the shared line (the retry band): those left with no untried usable rank are answered
// now, not at their queue timeout.
void balancer::turn_away_hopeless_retries_locked(cluster_queue& queue, handoffs& ready) {
  for (auto at = queue.shared.begin(); at != queue.shared.end() && at->first.priority == retry_band;) {
    auto& w = at->second;
    if (untried_usable_locked(w.request)) {
      ++at;
      continue;
    }
    ready.make_room();
    ready.add(std::move(w.deliver), rank_lease{});
    queue.order.abandoned(w.tag);
    const auto leaving = at++;
    leave_locked(queue, queue.shared, leaving);
  }
  count_waiting_locked();
}

wait_outcome balancer::acquire_or_wait(const pick_context& request, request_cost cost, const queue_share& share,
                                       std::function<void(rank_lease)> deliver) {
  cost = at_least_one_token(cost);
  handoffs ready;  // declared first: handed over after the unlock
  wait_outcome out;
  std::lock_guard lock(pick_mutex_);
  const auto pinned = request.pinned_rank;
  if (pinned ? *pinned >= detail_.size() : request.cluster >= clusters_.size()) return out;
  const std::size_t cluster = pinned ? ranks_[*pinned].cluster : request.cluster;
  // A waiter whose hold ended since the last event may now take a slot that suits it: it goes before this
  // request.
  if (queueing()) serve_locked(cluster, std::nullopt, ready);
  const auto now = clock::now();
  const auto hold_until = now + placement_wait(share);
  line_ref line{line_kind::shared, cluster};
  bool now_or_queue = true;  // it may take a slot at once, if its line is empty (no jumping the queue)
  std::uint32_t place_matched_tokens = 0;
  if (pinned) {
    line = {line_kind::pinned, *pinned};
  } else if (const auto at = queueing() && !share.retry ? preferred_locked(request, hold_until, now) : std::nullopt;
             at && !has_room_locked(at->rank)) {
    line = {line_kind::preferring, at->rank};  // its rank is full: it holds out for that rank's next slot
    place_matched_tokens = at->matched_tokens;
    now_or_queue = false;
  }
  const bool shared_line = line.kind == line_kind::shared;
  auto& queue = clusters_[cluster];
  // A non-empty line has no room for it (the invariant at release()), whatever its priority; a retry
  // comes before its every waiter.
  if (now_or_queue && (line_locked(line).empty() || share.retry)) {
    const auto chosen = shared_line ? pick_from_shared_line_locked(request, cost, now, now) : pick_locked(request, cost);
    if (chosen) out.lease = rank_lease(this, *chosen, cost);
  }
  if (!out.lease) out.state = refusal_locked(request, share);
  if (out.state == wait_state::queued) {
    out.waiter_id = next_waiter_id_++;
    waiter w{out.waiter_id, request, cost, now, std::move(deliver), {}, hold_until, place_matched_tokens};
    if (!share.retry) w.request.avoid = nullptr;
    enqueue_locked(std::move(w), line, cluster, share);
    count_waiting_locked();
    // The shared line may hold waiters passed over for the room there (long prompts, retries): the newcomer
    // may suit that room.
    if (shared_line && cluster_has_room_locked(cluster)) serve_locked(cluster, std::nullopt, ready);
  } else if (!out.lease && out.state != wait_state::no_usable_rank &&
             (now_or_queue ? line_locked(line).empty() || shared_line : queue.shared.empty())) {
    // It would have held out for its full rank, or passed over a rank still prefilling a long prompt, or
    // found its line holding only waiters passed over for the room there (the serve above left it to them),
    // but cannot wait (the queue or its tenant's share of it is full, or it is closing): a slot beats a
    // refusal, as it would for a request with no place.
    if (const auto chosen = pick_locked(request, cost)) out.lease = rank_lease(this, *chosen, cost);
  }
  if (out.lease) out.state = wait_state::served;
  return out;
}

bool balancer::cancel_wait(std::uint64_t waiter_id) {
  handoffs ready;               // declared first: handed over after the unlock
  waiting_line::node dropped;  // destroyed after the unlock: its closure may own anything
  std::lock_guard lock(pick_mutex_);
  const auto found = places_.find(waiter_id);
  if (found == places_.end()) return false;
  const auto place = found->second;
  auto& queue = clusters_[place.cluster];
  auto& line = line_locked(place.line);
  const auto at = line.find(place.key);
  queue.order.abandoned(at->second.tag);
  dropped = leave_locked(queue, line, at);
  count_waiting_locked();
  // A retry that left may have been passing over the room in the shared line.
  if (queueing()) serve_locked(place.cluster, std::nullopt, ready);
  return true;
}

void balancer::reconsider() {
  handoffs ready;  // declared first: handed over after the unlock
  std::lock_guard lock(pick_mutex_);
  if (!queueing()) return;
  for (std::size_t c = 0; c < clusters_.size(); ++c) serve_locked(c, std::nullopt, ready);
}

void balancer::close() {
  std::vector<waiting_line> dropped;  // destroyed after the unlock: a waiter's closure may own anything
  std::lock_guard lock(pick_mutex_);
  closed_ = true;
  dropped.reserve(clusters_.size() + 2 * detail_.size());
  for (auto& queue : clusters_) {
    dropped.push_back(std::exchange(queue.shared, {}));
    queue.holds.clear();
    queue.order.clear();
    queue.waiting = 0;
  }
  for (auto& d : detail_) {
    dropped.push_back(std::exchange(d.pinned, {}));
    dropped.push_back(std::exchange(d.preferring, {}));
  }
  places_.clear();
  count_waiting_locked();
}

std::size_t balancer::waiting_of(std::uint64_t tenant) const {
  std::lock_guard lock(pick_mutex_);
  return waiting_of_locked(tenant);
}

std::size_t balancer::queue_bands() const {
  std::lock_guard lock(pick_mutex_);
  std::size_t n = 0;
  for (const auto& queue : clusters_) n += queue.order.bands();
  return n;
}

void balancer::serve_locked(std::size_t cluster, std::optional<std::size_t> freed, handoffs& ready) noexcept {
  auto& queue = clusters_[cluster];
  if (queue.waiting == 0) return;
  try {
    const auto now = clock::now();
    end_holds_locked(queue, now);
    serve_rounds_locked(cluster, freed, ready, now);
  } catch (const std::bad_alloc&) {
    // The round that failed changed nothing (its hand-over's room is made before its waiter leaves): that
    // waiter, and every one behind it, stays in its line for the next event.
  }
  count_waiting_locked();
}

// Rounds, each on the soonest of the waiters the room can suit: the freed rank's pinned and preferring heads
// (while that rank has room) and the first waiter of the shared line not passed over in this call (while the
// cluster has room). The waiter then:
//  - pinned: takes its rank's slot;
//  - preferring: takes its place's slot (take_place_locked: its place was judged when it joined the line);
//  - shared: its place is judged afresh (the load and the prefix index moved since it queued, its hold may
//    be over): a place on a full rank sends it to that rank's line; a place with room, or none, re-runs the
//    whole pick for it, which takes a slot with room (a retry has no place: a rank it has not tried);
//  - or, in the shared line, is passed over (a long prompt, a retry the room does not suit) or, a retry with
//    no untried usable rank, turned away; else its line is stuck for the call (rounds only take room).
// Each round serves, moves or passes over a waiter, or sticks a line, so the rounds end; each is a few O(log n)
// steps on the lines, and a pick (O(n) in the cluster's ranks) unless the waiter takes its place.
void balancer::serve_rounds_locked(std::size_t cluster, std::optional<std::size_t> freed, handoffs& ready,
                                   clock::time_point now) {
  auto& queue = clusters_[cluster];
  auto next_shared = queue.shared.begin();
  bool stuck[3] = {false, false, false};  // by line_kind
  for (;;) {
    const bool freed_room = freed && usable_with_room_locked(*freed);
    waiting_line* line = nullptr;
    waiting_line::iterator at;
    line_kind kind = line_kind::shared;
    const auto consider = [&](waiting_line& candidate, waiting_line::iterator head, line_kind k) {
      if (stuck[static_cast<int>(k)] || head == candidate.end()) return;
      if (!line || head->first < at->first) {
        line = &candidate;
        at = head;
        kind = k;
      }
    };
    if (freed_room) {
      consider(detail_[*freed].pinned, detail_[*freed].pinned.begin(), line_kind::pinned);
      consider(detail_[*freed].preferring, detail_[*freed].preferring.begin(), line_kind::preferring);
    }
    if (!stuck[static_cast<int>(line_kind::shared)] && next_shared != queue.shared.end()) {
      if (freed_room || cluster_has_room_locked(cluster)) {
        consider(queue.shared, next_shared, line_kind::shared);
      } else {
        stuck[static_cast<int>(line_kind::shared)] = true;
      }
    }
    if (!line) return;
    auto& w = at->second;
    const bool shared = kind == line_kind::shared;
    if (kind == line_kind::preferring) {
      ready.make_room();  // before the slot is taken: a lease made and then dropped would release itself under this lock
      take_place_locked(*freed, w);
      ready.add(std::move(w.deliver), rank_lease(this, *freed, w.cost));
      queue.order.served(w.tag);
      leave_locked(queue, *line, at);
      continue;
    }
    if (shared && !w.request.avoid) {
      if (const auto place = preferred_locked(w.request, w.hold_until, now); place && !has_room_locked(place->rank)) {
        ++next_shared;
        w.place_matched_tokens = place->matched_tokens;
        move_locked(*line, at, line_ref{line_kind::preferring, place->rank});
        continue;
      }
    }
    ready.make_room();  // before the pick: a lease made and then dropped would release itself under this lock
    if (const auto chosen = shared ? pick_from_shared_line_locked(w.request, w.cost, w.since, now)
                                   : pick_locked(w.request, w.cost)) {
      ready.add(std::move(w.deliver), rank_lease(this, *chosen, w.cost));
      queue.order.served(w.tag);
      if (shared) ++next_shared;
      leave_locked(queue, *line, at);
    } else if (shared && w.request.avoid && !untried_usable_locked(w.request)) {
      ready.add(std::move(w.deliver), rank_lease{});  // a retry with no rank left to try: refused now
      queue.order.abandoned(w.tag);
      ++next_shared;
      leave_locked(queue, *line, at);
    } else if (shared && (spreads(w.request) || w.request.avoid)) {
      ++next_shared;  // passed over: the room may suit those behind it
    } else {
      stuck[static_cast<int>(kind)] = true;
    }
  }
}

// Whether some usable rank of the request's cluster is not one it tried (pick_context::avoid).
bool balancer::untried_usable_locked(const pick_context& request) const noexcept {
  if (request.cluster >= clusters_.size()) return false;
  return std::ranges::any_of(clusters_[request.cluster].ranks, [&](std::size_t r) {
    const bool tried = request.avoid && r < request.avoid->size() && (*request.avoid)[r];
    return !tried && ranks_[r].flags.load(std::memory_order_relaxed) == 0;
  });
}

// The pick for a request of a cluster's shared line: a long prompt (queue_limits::long_prompt_tokens) passes
// over the ranks still prefilling one while some other usable rank of its cluster is not, for at most
// long_prompt_hold since it came; nullopt when the room is only there (or nowhere). Any other request's pick
// is the plain one. (On a rank already prefilling one, a long prompt's first token comes a whole prefill
// later; the rank it passed over is judged again when that prefill ends: the stream's first byte.)
std::optional<std::size_t> balancer::pick_from_shared_line_locked(const pick_context& request, request_cost& cost,
                                                                  clock::time_point since, clock::time_point now) {
  if (!spreads(request) || now - since >= limits_.long_prompt_hold || request.avoid ||
      request.cluster >= clusters_.size()) {
    return pick_locked(request, cost);
  }
  passed_over_.assign(detail_.size(), false);  // capacity kept
  bool prefilling = false;
  bool idle = false;  // some usable rank of its cluster is prefilling no long prompt
  for (const std::size_t r : clusters_[request.cluster].ranks) {
    const auto& state = ranks_[r];
    if (state.flags.load(std::memory_order_relaxed) != 0) continue;
    const bool busy = state.long_prefills.load(std::memory_order_relaxed) > 0;
    passed_over_[r] = busy;
    (busy ? prefilling : idle) = true;
  }
  if (!prefilling || !idle) return pick_locked(request, cost);
  pick_context narrowed = request;
  narrowed.avoid = &passed_over_;
  return pick_locked(narrowed, cost);
}

// A removed rank never comes back on its own (health, ejection and drains do): its pinned waiters, and the
// queue of a cluster left with no rank at all, would wait for nothing until their queue timeout. Each gets
// an empty lease now: refused at once. Those whose place it was stand in their cluster's shared line.
void balancer::turn_away_stranded_locked(std::size_t rank, handoffs& ready) {
  const std::size_t cluster = ranks_[rank].cluster;
  auto& queue = clusters_[cluster];
  const auto turn_away = [&](waiting_line& line) {
    while (!line.empty()) {
      auto at = line.begin();
      ready.make_room();
      ready.add(std::move(at->second.deliver), rank_lease{});
      queue.order.abandoned(at->second.tag);
      leave_locked(queue, line, at);
    }
  };
  turn_away(detail_[rank].pinned);
  give_up_places_on_locked(rank);
  const bool cluster_left = std::ranges::any_of(queue.ranks, [this](std::size_t r) {
    return (ranks_[r].flags.load(std::memory_order_relaxed) & rank_flag::removed) == 0;
  });
  if (!cluster_left) turn_away(queue.shared);
  count_waiting_locked();
}

}  // namespace dplb::balancer
