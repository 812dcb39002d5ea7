#include "dplb/balancer/balancer.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <stdexcept>
#include <utility>

namespace dplb::balancer {

rank_lease::rank_lease(rank_lease&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), rank_(other.rank_), cost_(other.cost_) {}

rank_lease& rank_lease::operator=(rank_lease&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    rank_ = other.rank_;
    cost_ = other.cost_;
  }
  return *this;
}

void rank_lease::prompt_done() noexcept {
  if (owner_ && cost_.prompt > 0) owner_->release_cost(rank_, request_cost{std::exchange(cost_.prompt, 0), 0});
}

void rank_lease::release() noexcept {
  if (auto* owner = std::exchange(owner_, nullptr)) owner->release(rank_, cost_);
}

namespace {

std::vector<std::unique_ptr<policy>> one_policy(std::unique_ptr<policy> p) {
  std::vector<std::unique_ptr<policy>> out;
  out.push_back(std::move(p));
  return out;
}

}  // namespace

balancer::balancer(std::size_t rank_count, std::unique_ptr<policy> chosen_policy, queue_limits limits,
                   rank_timing timing, std::size_t capacity)
    : balancer(std::vector<std::size_t>(rank_count, 0), one_policy(std::move(chosen_policy)), limits, timing,
               capacity) {}

balancer::balancer(std::span<const std::size_t> rank_clusters, std::vector<std::unique_ptr<policy>> policies,
                   queue_limits limits, rank_timing timing, std::size_t capacity)
    : policies_(std::move(policies)),
      limits_(limits),
      timing_(timing),
      queues_(policies_.size()),
      capacity_(std::max(capacity, rank_clusters.size())),
      ranks_(std::make_unique<rank_state[]>(capacity_)),
      rank_count_(rank_clusters.size()),
      detail_(rank_clusters.size()),
      view_(rank_clusters.size()),
      loads_(rank_clusters.size()) {
  if (rank_clusters.empty()) throw std::invalid_argument("balancer needs at least one rank");
  if (policies_.empty() || std::ranges::any_of(policies_, [](const auto& p) { return !p; })) {
    throw std::invalid_argument("balancer needs a policy per cluster");
  }
  for (std::size_t r = 0; r < rank_clusters.size(); ++r) {
    if (rank_clusters[r] >= policies_.size()) throw std::out_of_range("balancer: rank of an unknown cluster");
    ranks_[r].cluster = rank_clusters[r];
  }
  hears_releases_ = std::ranges::any_of(policies_, [](const auto& p) { return p->hears_releases(); });
}

void balancer::enable_affinity(double load_bound, routing_stats* stats) {
  std::lock_guard lock(pick_mutex_);
  affinity_.emplace();
  affinity_->add_ranks(0, rank_count_.load(std::memory_order_relaxed));
  affinity_bound_ = load_bound;
  routing_stats_ = stats;
}

void balancer::add_ranks(std::span<const std::uint32_t> weights, std::size_t cluster) {
  if (cluster >= policies_.size()) throw std::out_of_range("balancer: no cluster " + std::to_string(cluster));
  std::vector<delivery> ready;  // declared first: any lease left in it is released after the unlock
  {
    std::lock_guard lock(pick_mutex_);
    const std::size_t first = rank_count_.load(std::memory_order_relaxed);
    if (weights.size() > capacity_ - first) {
      throw std::length_error("balancer: no room for " + std::to_string(weights.size()) + " more ranks");
    }
    const auto now = clock::now();
    for (std::size_t i = 0; i < weights.size(); ++i) {
      ranks_[first + i].weight.store(std::max<std::uint32_t>(1, weights[i]), std::memory_order_relaxed);
      ranks_[first + i].cluster = cluster;
      auto& d = detail_.emplace_back();
      // A new engine's caches are as cold as a readmitted one's.
      if (timing_.slow_start.count() > 0) {
        d.ramp_until = now + timing_.slow_start;
        ++ramping_;
      }
    }
    view_.resize(first + weights.size());
    loads_.resize(first + weights.size());
    // Published last: a reader that sees the new count sees the new ranks' weights.
    rank_count_.store(first + weights.size(), std::memory_order_release);
    for (std::size_t i = 0; i < weights.size(); ++i) policies_[cluster]->on_state_change(first + i, 0);
    if (affinity_) affinity_->add_ranks(first, weights.size());
    if (queueing()) serve_waiters_locked(ready);  // waiters may fit on the new ranks
  }
  deliver(ready);
}

bool balancer::has_room_locked(std::size_t rank) const noexcept {
  const auto cap = limits_.max_inflight_per_rank;
  return cap == 0 || ranks_[rank].inflight.load(std::memory_order_relaxed) < cap;
}

bool balancer::cluster_has_room_locked(std::size_t cluster) const noexcept {
  for (std::size_t r = 0; r < detail_.size(); ++r) {
    if (ranks_[r].cluster == cluster && ranks_[r].flags.load(std::memory_order_relaxed) == 0 && has_room_locked(r)) {
      return true;
    }
  }
  return false;
}

// The policy's view of every rank just before a pick. Slow start scales the weight of a rank that came
// back a moment ago: from a tenth of it (so that it gets some traffic at once) to all of it, linearly.
void balancer::refresh_view_locked(const pick_context& request, bool room_matters) {
  const bool ramping = ramping_ > 0;
  // The clock is read only when something depends on it: a ramp, or engine stats to judge fresh.
  const auto now = ramping || stats_seen_ ? clock::now() : clock::time_point{};
  for (std::size_t i = 0; i < view_.size(); ++i) {
    auto& v = view_[i];
    const auto& r = ranks_[i];
    auto& d = detail_[i];
    v.inflight = r.inflight.load(std::memory_order_relaxed);
    v.cost_inflight = r.cost.load(std::memory_order_relaxed);
    v.prompt_inflight = r.prompt_cost.load(std::memory_order_relaxed);
    v.flags = r.flags.load(std::memory_order_relaxed);
    v.weight = r.weight.load(std::memory_order_relaxed);
    v.usable = v.flags == 0 && r.cluster == request.cluster &&
               !(request.avoid && i < request.avoid->size() && (*request.avoid)[i]) && (!room_matters || has_room_locked(i));
    if (ramping && d.ramp_until != clock::time_point{}) {
      if (now >= d.ramp_until) {
        d.ramp_until = {};
        --ramping_;
      } else {
        const double left = std::chrono::duration<double>(d.ramp_until - now) / timing_.slow_start;
        v.weight *= std::max(0.1, 1.0 - left);
      }
    }
    v.engine.fresh = d.engine_ever && now - d.read_at <= timing_.stats_max_age;
    v.engine.load = d.engine;
    v.engine.inflight_at_read = d.inflight_at_read;
  }
}

// The session's rank on the ring, or the next within the load bound (view_ is fresh).
std::optional<std::size_t> balancer::place_session_locked(std::string_view key) {
  const load_bound bound(view_, affinity_bound_);
  const auto placed = affinity_->place(key, view_, [&](const rank_view& h) { return bound.allows(h); });
  if (!placed) return std::nullopt;
  if (routing_stats_) {
    (placed->moved ? routing_stats_->affinity_overridden : routing_stats_->affinity_taken)
        .fetch_add(1, std::memory_order_relaxed);
  }
  return placed->rank;
}

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

std::optional<std::size_t> balancer::pick_locked(const pick_context& request, request_cost cost) {
  std::optional<std::size_t> chosen;
  if (request.pinned_rank) {
    // The client named the rank: it is the only candidate, and the policy is not asked.
    const auto r = *request.pinned_rank;
    if (r < rank_count() && ranks_[r].flags.load(std::memory_order_relaxed) == 0 && has_room_locked(r)) chosen = r;
  } else {
    refresh_view_locked(request);
    if (request.cluster >= policies_.size()) return std::nullopt;
    if (affinity_ && !request.session_key.empty()) chosen = place_session_locked(request.session_key);
    if (!chosen) chosen = policies_[request.cluster]->choose(request, view_);
    if (chosen && (*chosen >= view_.size() || !view_[*chosen].usable)) chosen.reset();
  }
  if (!chosen) return std::nullopt;
  // Incremented while the lock is held: the next pick, on any thread, already sees this request.
  auto& r = ranks_[*chosen];
  r.inflight.fetch_add(1, std::memory_order_relaxed);
  r.picks.fetch_add(1, std::memory_order_relaxed);
  if (const std::uint64_t tokens = std::uint64_t{cost.prompt} + cost.decode) r.cost.fetch_add(tokens, std::memory_order_relaxed);
  if (cost.prompt > 0) r.prompt_cost.fetch_add(cost.prompt, std::memory_order_relaxed);
  return chosen;
}

namespace {

// Every request costs at least one token: one whose cost is unknown still weighs on its rank.
request_cost at_least_one_token(request_cost cost) noexcept {
  if (cost.prompt == 0 && cost.decode == 0) cost.decode = 1;
  return cost;
}

}  // namespace

rank_lease balancer::acquire(const pick_context& request, request_cost cost) {
  cost = at_least_one_token(cost);
  std::lock_guard lock(pick_mutex_);
  // No jumping the queue, except for a retry: it already had its turn (its first rank failed).
  if (!request.avoid) {
    if (request.pinned_rank ? *request.pinned_rank < detail_.size() && !detail_[*request.pinned_rank].pinned.empty()
                            : request.cluster < queues_.size() && !queues_[request.cluster].empty()) {
      return {};
    }
  }
  const auto chosen = pick_locked(request, cost);
  return chosen ? rank_lease(this, *chosen, cost) : rank_lease{};
}

void balancer::publish_engine_stats(std::span<const engine_reading> round) {
  std::lock_guard lock(pick_mutex_);
  for (std::size_t i = 0; i < round.size() && i < detail_.size(); ++i) {
    const auto& reading = round[i];
    auto& d = detail_[i];
    if (reading.good) {
      stats_seen_ = true;
      d.engine_ever = true;
      d.engine = reading.load;
      d.read_at = reading.read_at;
      d.inflight_at_read = reading.inflight_at_read;
    }
    loads_[i] = d.engine;
  }
  for (auto& p : policies_) p->on_engine_stats(loads_);
}

engine_status balancer::engine_stats_of(std::size_t rank) const {
  std::lock_guard lock(pick_mutex_);
  if (rank >= detail_.size()) return {};
  const auto& d = detail_[rank];
  return {d.engine_ever, d.engine, d.engine_ever ? clock::now() - d.read_at : clock::duration{}};
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
  if (order_.waiting_of(share.tenant) >= share.max_queued) return wait_state::tenant_queue_full;
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
    } else if (const auto place = queueing() ? preferred_locked(request, now, now) : std::nullopt;
               place && !has_room_locked(*place)) {
      line = &detail_[*place].preferring;  // its rank is full: it holds out for that rank's next slot
      now_or_queue = false;
    } else {
      line = &queues_[request.cluster];
    }
    // A non-empty line has no room for it (the invariant at release()), whatever its priority.
    if (now_or_queue && line->empty()) {
      if (const auto chosen = pick_locked(request, cost)) out.lease = rank_lease(this, *chosen, cost);
    }
    if (!out.lease) out.state = refusal_locked(request, share);
    if (out.state == wait_state::queued) {
      out.waiter_id = next_waiter_id_++;
      waiter w{out.waiter_id, request, cost, now, std::move(deliver),
               order_.enqueue(share.priority, share.tenant, share.weight, share.cost)};
      w.request.avoid = nullptr;
      insert_by_key(*line, std::move(w));
      count_waiting_locked();
    } else if (!out.lease && !now_or_queue && queues_[request.cluster].empty()) {
      // It would have held out for its full rank, but cannot wait (the queue or its tenant's share of it
      // is full, or it is closing): a slot elsewhere beats a refusal, as it would for a request with no place.
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
    order_.abandoned(it->tag);
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
  order_.clear();
  waiting_.store(0, std::memory_order_relaxed);
}

std::size_t balancer::waiting_of(std::uint64_t tenant) const {
  std::lock_guard lock(pick_mutex_);
  return order_.waiting_of(tenant);
}

std::size_t balancer::queue_bands() const {
  std::lock_guard lock(pick_mutex_);
  return order_.bands();
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
// the fair order, which lets only so many go ahead of it).
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
      if (const auto place = preferred_locked(head.request, head.since, now); place && !has_room_locked(*place)) {
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
    // A pinned head's pick checks its rank; any other's takes a rank with room (there is one).
    if (const auto chosen = pick_locked(head.request, head.cost)) {
      ready.push_back(delivery{std::move(head.deliver), rank_lease(this, *chosen, head.cost)});
      order_.served(head.tag);
      line->pop_front();
    } else {
      blocked_[slot] = 1;
    }
  }
  count_waiting_locked();
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

void balancer::release_cost(std::size_t rank, request_cost cost) noexcept {
  auto& r = ranks_[rank];
  if (const std::uint64_t tokens = std::uint64_t{cost.prompt} + cost.decode) r.cost.fetch_sub(tokens, std::memory_order_relaxed);
  if (cost.prompt > 0) r.prompt_cost.fetch_sub(cost.prompt, std::memory_order_relaxed);
}

// No freed slot may leave a waiter behind. A waiter is enqueued under pick_mutex_ after its pick, in
// the same critical section, found no rank with room that suits it; so with queueing on, every step that
// can give a waiter room (a release, a rank becoming usable or unusable, ranks added, a request arriving)
// changes the state and serves the queue in one critical section under that same mutex. The mutex
// orders the two: if the enqueue comes first, the freeing step finds the waiter and serves it; if the
// freeing step comes first, the enqueuer's pick sees the room and takes it instead of queueing. Hence
// the invariant, at every unlock: a cluster's shared line is empty or none of its ranks has room; each
// rank's pinned line is empty or that rank has no room; each rank's line of waiters whose place it is
// is empty, or that rank has no room and its head still holds out for it (within the load bound and its
// placement_wait, as judged at that step; see serve_waiters_locked). (Checking a waiter count outside
// the lock after a relaxed decrement, as a cheaper release would, misses the enqueuer that has picked but
// not yet published itself.)
// Without queueing nothing ever waits, and unless the policy hears releases a release stays lock-free.
void balancer::release(std::size_t rank, request_cost cost) noexcept {
  auto& r = ranks_[rank];
  release_cost(rank, cost);
  if (!queueing() && !hears_releases_) {
    r.inflight.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  std::vector<delivery> ready;  // declared first: any lease left in it is released after the unlock
  {
    std::lock_guard lock(pick_mutex_);
    r.inflight.fetch_sub(1, std::memory_order_relaxed);
    if (hears_releases_) policy_for_rank(rank).on_release(rank);
    if (queueing()) serve_waiters_locked(ready);
  }
  deliver(ready);
}

void balancer::set_flag(std::size_t rank, rank_flag flag, bool on) {
  std::vector<delivery> ready;
  {
    std::lock_guard lock(pick_mutex_);
    if (rank >= detail_.size()) throw std::out_of_range("balancer: no rank " + std::to_string(rank));
    auto& r = ranks_[rank];
    const std::uint8_t before = r.flags.load(std::memory_order_relaxed);
    const std::uint8_t after = on ? (before | flag) : (before & ~flag);
    if (after == before) return;
    r.flags.store(after, std::memory_order_relaxed);
    policy_for_rank(rank).on_state_change(rank, after);
    // Back in rotation after a failure or a removal: ramp up, its caches are cold (a drain's end starts
    // at full weight: the engine kept serving what was in flight).
    const bool readmitted =
        after == 0 && (before & (rank_flag::unhealthy | rank_flag::ejected | rank_flag::removed)) != 0;
    auto& d = detail_[rank];
    if (readmitted && timing_.slow_start.count() > 0) {
      if (d.ramp_until == clock::time_point{}) ++ramping_;
      d.ramp_until = clock::now() + timing_.slow_start;
    }
    // Back: waiters may fit on it. Out: those whose place it was now take any slot of their cluster.
    if (queueing()) serve_waiters_locked(ready);
    if (flag == rank_flag::removed && on) turn_away_stranded_locked(rank, ready);
  }
  deliver(ready);
}

// A removed rank never comes back on its own (health, ejection and drains do): its pinned waiters, and the
// queue of a cluster left with no rank at all, would wait for nothing until their queue timeout. Each gets
// an empty lease now: refused at once. Those whose place it was join their cluster's line: they take any
// of its slots.
void balancer::turn_away_stranded_locked(std::size_t rank, std::vector<delivery>& ready) {
  const auto turn_away = [&](std::deque<waiter>& line) {
    for (auto& w : line) {
      order_.abandoned(w.tag);
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

std::uint8_t balancer::flags(std::size_t rank) const noexcept {
  return ranks_[rank].flags.load(std::memory_order_relaxed);
}

void balancer::set_weight(std::size_t rank, std::uint32_t weight) {
  std::lock_guard lock(pick_mutex_);
  if (rank >= detail_.size()) throw std::out_of_range("balancer: no rank " + std::to_string(rank));
  ranks_[rank].weight.store(std::max<std::uint32_t>(1, weight), std::memory_order_relaxed);
}

std::uint32_t balancer::weight(std::size_t rank) const noexcept {
  return ranks_[rank].weight.load(std::memory_order_relaxed);
}

std::uint32_t balancer::inflight(std::size_t rank) const noexcept {
  return ranks_[rank].inflight.load(std::memory_order_relaxed);
}

std::uint64_t balancer::cost_inflight(std::size_t rank) const noexcept {
  return ranks_[rank].cost.load(std::memory_order_relaxed);
}

std::uint64_t balancer::picks(std::size_t rank) const noexcept {
  return ranks_[rank].picks.load(std::memory_order_relaxed);
}

bool balancer::any_usable() const noexcept {
  return std::ranges::any_of(ranks_in_use(),
                     [](const rank_state& r) { return r.flags.load(std::memory_order_relaxed) == 0; });
}

bool balancer::any_usable(std::size_t cluster) const noexcept {
  return std::ranges::any_of(ranks_in_use(), [cluster](const rank_state& r) {
    return r.cluster == cluster && r.flags.load(std::memory_order_relaxed) == 0;
  });
}

std::uint32_t balancer::inflight_skew() const noexcept {
  const std::size_t ranks = rank_count();
  std::uint32_t widest = 0;
  for (std::size_t c = 0; c < policies_.size(); ++c) {
    std::uint32_t lo = std::numeric_limits<std::uint32_t>::max();
    std::uint32_t hi = 0;
    std::size_t usable_count = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      // A rank's cluster never changes once it is published (a plain read is safe: written before the count).
      if (ranks_[r].cluster != c || ranks_[r].flags.load(std::memory_order_relaxed) != 0) continue;
      const auto n = ranks_[r].inflight.load(std::memory_order_relaxed);
      lo = std::min(lo, n);
      hi = std::max(hi, n);
      ++usable_count;
    }
    if (usable_count >= 2) widest = std::max(widest, hi - lo);
  }
  return widest;
}

}  // namespace dplb::balancer
