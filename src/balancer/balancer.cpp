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
  if (owner_ && (cost_.prompt > 0 || cost_.long_prompt)) {
    owner_->prompt_done(rank_, request_cost{std::exchange(cost_.prompt, 0), 0, std::exchange(cost_.long_prompt, false)});
  }
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
      clusters_(policies_.size()),
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
    clusters_[rank_clusters[r]].ranks.push_back(r);
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
  handoffs ready;  // declared first: handed over after the unlock
  {
    std::lock_guard lock(pick_mutex_);
    const std::size_t first = rank_count_.load(std::memory_order_relaxed);
    if (weights.size() > capacity_ - first) {
      throw std::length_error("balancer: no room for " + std::to_string(weights.size()) + " more ranks");
    }
    auto& members = clusters_[cluster].ranks;
    members.reserve(members.size() + weights.size());  // before anything changes: the appends below cannot throw
    detail_.reserve(first + weights.size());
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
    for (std::size_t i = 0; i < weights.size(); ++i) members.push_back(first + i);
    // Published last: a reader that sees the new count sees the new ranks' weights.
    rank_count_.store(first + weights.size(), std::memory_order_release);
    for (std::size_t i = 0; i < weights.size(); ++i) policies_[cluster]->on_state_change(first + i, 0);
    if (affinity_) affinity_->add_ranks(first, weights.size());
    if (queueing()) serve_locked(cluster, std::nullopt, ready);  // waiters may fit on the new ranks
  }
}

bool balancer::has_room_locked(std::size_t rank) const noexcept {
  const auto cap = limits_.max_inflight_per_rank;
  return cap == 0 || ranks_[rank].inflight.load(std::memory_order_relaxed) < cap;
}

bool balancer::usable_with_room_locked(std::size_t rank) const noexcept {
  return ranks_[rank].flags.load(std::memory_order_relaxed) == 0 && has_room_locked(rank);
}

bool balancer::cluster_has_room_locked(std::size_t cluster) const noexcept {
  return std::ranges::any_of(clusters_[cluster].ranks, [this](std::size_t r) { return usable_with_room_locked(r); });
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
    v.inflight = r.inflight.load(std::memory_order_relaxed) + r.others.load(std::memory_order_relaxed);
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

std::optional<std::size_t> balancer::pick_locked(const pick_context& request, request_cost& cost) {
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
  count_pick_locked(*chosen, request, cost);
  return chosen;
}

// Incremented while the lock is held: the next pick, on any thread, already sees this request.
void balancer::count_pick_locked(std::size_t rank, const pick_context& request, request_cost& cost,
                                 bool by_ledger) noexcept {
  auto& r = ranks_[rank];
  r.inflight.fetch_add(1, std::memory_order_relaxed);
  r.picks.fetch_add(1, std::memory_order_relaxed);
  if (const std::uint64_t tokens = std::uint64_t{cost.prompt} + cost.decode) r.cost.fetch_add(tokens, std::memory_order_relaxed);
  if (cost.prompt > 0) r.prompt_cost.fetch_add(cost.prompt, std::memory_order_relaxed);
  cost.long_prompt = prefills_long(request);
  if (cost.long_prompt) r.long_prefills.fetch_add(1, std::memory_order_relaxed);
  if (listener_ && !by_ledger) listener_->picked(rank, cost);
}

// Every request costs at least one token: one whose cost is unknown still weighs on its rank.
request_cost balancer::at_least_one_token(request_cost cost) noexcept {
  if (cost.prompt == 0 && cost.decode == 0) cost.decode = 1;
  return cost;
}

rank_lease balancer::acquire(const pick_context& request, request_cost cost) {
  cost = at_least_one_token(cost);
  std::lock_guard lock(pick_mutex_);
  // No jumping the queue, except for a retry: it already had its turn (its first rank failed).
  if (!request.avoid) {
    if (request.pinned_rank ? *request.pinned_rank < detail_.size() && !detail_[*request.pinned_rank].pinned.empty()
                            : request.cluster < clusters_.size() && !clusters_[request.cluster].shared.empty()) {
      return {};
    }
  }
  const auto chosen = pick_locked(request, cost);
  return chosen ? rank_lease(this, *chosen, cost) : rank_lease{};
}

void balancer::candidates(const pick_context& request, std::vector<weighted_rank>& out) {
  out.clear();
  std::lock_guard lock(pick_mutex_);
  if (request.cluster >= policies_.size()) return;
  refresh_view_locked(request, /*room_matters=*/false);
  if (request.pinned_rank) {
    const auto r = *request.pinned_rank;
    if (r < view_.size() && ranks_[r].flags.load(std::memory_order_relaxed) == 0) out.push_back({r, view_[r].weight});
    return;
  }
  const policy& rule = *policies_[request.cluster];
  for (const std::size_t r : clusters_[request.cluster].ranks) {
    if (view_[r].usable && view_[r].weight > 0) out.push_back({r, view_[r].weight, rule.engine_floor(view_[r])});
  }
}

rank_lease balancer::acquire_chosen(std::size_t rank, const pick_context& request, request_cost cost) {
  cost = at_least_one_token(cost);
  std::lock_guard lock(pick_mutex_);
  if (rank >= rank_count() || ranks_[rank].flags.load(std::memory_order_relaxed) != 0) return {};
  if (request.pinned_rank ? *request.pinned_rank != rank : ranks_[rank].cluster != request.cluster) return {};
  count_pick_locked(rank, request, cost, /*by_ledger=*/true);
  return rank_lease(this, rank, cost);
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

void balancer::release_cost(std::size_t rank, request_cost cost) noexcept {
  auto& r = ranks_[rank];
  if (const std::uint64_t tokens = std::uint64_t{cost.prompt} + cost.decode) r.cost.fetch_sub(tokens, std::memory_order_relaxed);
  if (cost.prompt > 0) r.prompt_cost.fetch_sub(cost.prompt, std::memory_order_relaxed);
  if (cost.long_prompt) r.long_prefills.fetch_sub(1, std::memory_order_relaxed);
}

// The engine's first byte came: the prompt is prefilled. When it was a long one, a long prompt that passed
// over the rank for it may take the rank's room now (without this event it would wait for the next release).
void balancer::prompt_done(std::size_t rank, request_cost prefilled) noexcept {
  release_cost(rank, prefilled);
  if (listener_ && prefilled.prompt > 0) listener_->prompt_done(rank, prefilled.prompt);
  if (!queueing() || !prefilled.long_prompt) return;
  handoffs ready;  // declared first: handed over after the unlock
  std::lock_guard lock(pick_mutex_);
  serve_locked(ranks_[rank].cluster, rank, ready);
}

// No freed slot may leave a waiter behind. A waiter is enqueued under pick_mutex_ after its pick, in the same
// critical section, found no rank with room that suits it; every step that can give a waiter room (a release, a
// rank's state, ranks added, an arrival, a hold ending) changes the state and serves that cluster's queue in one
// critical section under the same mutex, so the two are ordered. Hence, at every unlock: a rank with room has
// no one in its pinned or preferring line, and a cluster's shared line is empty, or none of its ranks has room,
// or its every waiter passes that room over (a long prompt, a retry). So a release need look only at the freed
// rank's lines and its cluster's shared line. (A waiter count checked outside the lock after a relaxed
// decrement, as a cheaper release would, misses the enqueuer that has picked but not yet published itself.)
// Without queueing nothing ever waits, and unless the policy hears releases a release stays lock-free.
void balancer::release(std::size_t rank, request_cost cost) noexcept {
  auto& r = ranks_[rank];
  release_cost(rank, cost);
  if (listener_) listener_->released(rank, cost);
  if (!queueing() && !hears_releases_) {
    r.inflight.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  handoffs ready;  // declared first: handed over after the unlock
  std::lock_guard lock(pick_mutex_);
  r.inflight.fetch_sub(1, std::memory_order_relaxed);
  if (hears_releases_) policy_for_rank(rank).on_release(rank);
  // The freed slot is on this rank: only its lines and its cluster's shared line can take it.
  if (queueing()) serve_locked(r.cluster, rank, ready);
}

void balancer::set_flag(std::size_t rank, rank_flag flag, bool on) {
  handoffs ready;  // declared first: handed over after the unlock
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
    // Back: waiters may fit on it. Out: those whose place it was now take any slot of their cluster, and a
    // retry left with no untried usable rank is answered now.
    if (queueing()) {
      auto& queue = clusters_[r.cluster];
      if (before == 0) {
        give_up_places_on_locked(rank);
        turn_away_hopeless_retries_locked(queue, ready);
      }
      serve_locked(r.cluster, rank, ready);
    }
    if (flag == rank_flag::removed && on) turn_away_stranded_locked(rank, ready);
  }
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

std::uint64_t balancer::prompt_inflight(std::size_t rank) const noexcept {
  return rank < rank_count() ? ranks_[rank].prompt_cost.load(std::memory_order_relaxed) : 0;
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
