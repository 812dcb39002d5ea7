#pragma once
// The one shared truth of per-rank load. Every worker thread picks through the same balancer, so a
// burst is spread exactly even with several threads; there are no per-thread copies of the counts.
//
// Threading contract: every member may be called from any thread. acquire() holds a mutex for the
// policy's choice and the increment together (a pick and its count are one step, so two threads can
// never both see a rank as least loaded). Reads are lock-free atomics, and so are releases unless
// queueing is on or the policy hears releases; then a release takes the mutex, so that a freed slot can
// never miss a waiter (see balancer::release). State changes (flags, weights, engine stats) take the
// mutex: they are rare, and the policy hears them in order with its picks.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "dplb/balancer/affinity_ring.hpp"
#include "dplb/balancer/fair_order.hpp"
#include "dplb/balancer/queue_lines.hpp"
#include "dplb/balancer/rank_lease.hpp"
#include "dplb/balancer/waiter.hpp"
#include "dplb/balancer/policy.hpp"
#include "dplb/balancer/routing_stats.hpp"

namespace dplb::balancer {

// Optional queueing in dplb (--max-inflight-per-rank): a rank at its limit takes no new request; when no rank
// with room suits a request, it waits in its cluster's queue (queue_lines.hpp: its lines and their rules), so
// imbalance never hides in an engine's own queue. The order (fair_order.hpp) is by priority, lowest value first;
// among equal priorities tenants share the freed slots by weight, a request counting its queue_share::cost
// (start-time fair queueing); one tenant's requests in their order of arrival: with one tenant, one weight,
// one cost and one priority, the queue is plain FIFO. A waiter is a whole request: a freed slot re-runs its
// whole pick (affinity ring, then its cluster's policy), unless the waiter holds out for that very rank (its
// place, judged when it joined that rank's line: the slot is its own). A lower priority waits as long as higher ones keep
// every suitable slot busy (as in vLLM's priority scheduling); its queue timeout bounds that.
struct queue_limits {
  std::uint32_t max_inflight_per_rank = 0;  // 0: no limit, no queueing
  std::size_t max_waiting = 1024;           // beyond: refused at once (every cluster's queue together)
  // How long a waiter holds out for its own rank while others have room (the application: half of
  // --queue-timeout-ms). 0: never, the first slot of its cluster is as good.
  std::chrono::milliseconds placement_wait{15'000};
  // A prompt of at least this many tokens (estimated, as request_cost::prompt) is long: a queued one is
  // not given a slot on a rank still prefilling another, while another rank is not, for at most
  // long_prompt_hold: under load a slot frees elsewhere within a step or two, which costs it far less than
  // a whole prefill's wait. 0: off.
  std::uint32_t long_prompt_tokens = 0;
  std::chrono::milliseconds long_prompt_hold{500};
};

struct rank_timing {
  // A rank readmitted after a health failure or an ejection starts at a tenth of its weight and ramps up
  // linearly over this long (Envoy's slow start), so that it is not flooded while its caches are cold.
  // 0: off.
  std::chrono::milliseconds slow_start{0};
  // Engine stats older than this are stale: the policies then ignore them and go by dplb's counts.
  std::chrono::milliseconds stats_max_age{1'000};
};

// One engine-stats read of a rank, as the poller hands it over.
struct engine_reading {
  bool good = false;  // false: no usable answer this round (the last good one keeps aging)
  engine_load load{};
  std::uint32_t inflight_at_read = 0;  // the most of dplb's requests the engine can have counted in the read
  std::chrono::steady_clock::time_point read_at{};
};

// A rank's engine stats as exported (metrics, /ranks).
struct engine_status {
  bool ever = false;  // a good read arrived once
  engine_load load{};
  std::chrono::steady_clock::duration age{};
};

// What this replica's requests do, told to the ledger replicas share (replica_ledger.hpp): each pick made
// here, each release and each first byte, with what the request holds. Called on the thread that picks or
// releases; must not block.
class release_listener {
 public:
  virtual ~release_listener() = default;
  // A request this replica picked by its own counts (not through acquire_chosen), as counted; called
  // under the balancer's lock.
  virtual void picked(std::size_t rank, request_cost counted) noexcept = 0;
  virtual void released(std::size_t rank, request_cost held) noexcept = 0;
  virtual void prompt_done(std::size_t rank, std::uint32_t prompt) noexcept = 0;
};

// A rank a pick made elsewhere (the shared ledger) may choose, and its weight as the policies see it.
struct weighted_rank {
  std::size_t rank = 0;
  double weight = 1;
  double floor = 0;  // policy::engine_floor
};

class balancer {
 public:
  // Room is made for `capacity` ranks (at least rank_count) once: the per-rank counters are read without
  // the lock, so they never move; add_ranks() takes the next ones.
  balancer(std::size_t rank_count, std::unique_ptr<policy> chosen_policy, queue_limits limits = {},
           rank_timing timing = {}, std::size_t capacity = 0);
  // Clusters: cluster c's ranks are balanced by policies[c] among themselves (its own rotation, its own
  // queue); rank r belongs to cluster rank_clusters[r]. A request names its cluster in pick_context.
  balancer(std::span<const std::size_t> rank_clusters, std::vector<std::unique_ptr<policy>> policies,
           queue_limits limits = {}, rank_timing timing = {}, std::size_t capacity = 0);

  // Session affinity (--affinity-header): from now on a request with a session key (pick_context::session_key)
  // goes to its key's rank on a consistent-hash ring, within the load bound `load_bound` (routing_stats.hpp),
  // before its policy is asked; decisions are counted in `stats` (may be null). Call before serving.
  void enable_affinity(double load_bound, routing_stats* stats);

  // Appends ranks (the next global numbers) of one cluster, each with its weight, usable at once. Unless they
  // are the first, they ramp up over the slow start like a readmitted rank. Throws std::length_error beyond
  // the capacity, std::out_of_range for an unknown cluster.
  void add_ranks(std::span<const std::uint32_t> weights, std::size_t cluster = 0);

  // Chooses a rank and counts the request on it; an empty lease when no rank is usable (or, pinned, when
  // its rank is not usable or full). A request with `avoid` set is a retry: it does not wait behind queued
  // requests (it already had its turn).
  rank_lease acquire(const pick_context& request = {}, request_cost cost = {});

  // Picks made by the shared ledger (--shared-state): the ranks the request may go to (the usable ranks of
  // its cluster, or its pinned rank, less those it tried), with their weights (slow start included); room is
  // not judged here, the ledger judges it on every replica's counts.
  void candidates(const pick_context& request, std::vector<weighted_rank>& out);
  // Counts the request on `rank`, which the ledger chose: an empty lease when the rank is no longer usable
  // (or not the request's). The policy is not asked.
  rank_lease acquire_chosen(std::size_t rank, const pick_context& request, request_cost cost);
  // The other replicas' requests in flight on the rank, as the shared ledger last said (0 without one): the
  // policies that pick here (prefix-aware, an affinity header, any pick while Redis is away) weigh every
  // replica's load by it, this replica's own live count plus this estimate. Any thread.
  void set_others(std::size_t rank, std::uint32_t requests) noexcept {
    if (rank < rank_count()) ranks_[rank].others.store(requests, std::memory_order_relaxed);
  }
  std::uint32_t others(std::size_t rank) const noexcept {
    return rank < rank_count() ? ranks_[rank].others.load(std::memory_order_relaxed) : 0;
  }
  // Hears every pick made here, release and first byte from now on (null: none). Set before serving;
  // outlives every lease.
  void set_release_listener(release_listener* listener) noexcept { listener_ = listener; }

  // Rank state: flags (rank_flag bits, each set or cleared on its own), weight.
  void set_flag(std::size_t rank, rank_flag flag, bool on);
  std::uint8_t flags(std::size_t rank) const noexcept;
  bool usable(std::size_t rank) const noexcept { return flags(rank) == 0; }
  void set_weight(std::size_t rank, std::uint32_t weight);
  std::uint32_t weight(std::size_t rank) const noexcept;

  std::size_t rank_count() const noexcept { return rank_count_.load(std::memory_order_acquire); }
  std::uint32_t inflight(std::size_t rank) const noexcept;
  std::uint64_t cost_inflight(std::size_t rank) const noexcept;
  std::uint64_t prompt_inflight(std::size_t rank) const noexcept;  // the prompt part of cost_inflight
  std::uint64_t picks(std::size_t rank) const noexcept;  // requests ever sent to the rank
  bool any_usable() const noexcept;
  bool any_usable(std::size_t cluster) const noexcept;  // among that cluster's ranks

  // max - min in-flight over the usable ranks of one cluster, the largest over the clusters (0 when no
  // cluster has two usable ranks): ranks serving different models are not expected to carry alike.
  std::uint32_t inflight_skew() const noexcept;

  // The policy of the first (or only) cluster; each cluster's own by policy_of.
  const policy& active_policy() const noexcept { return *policies_.front(); }
  const policy& policy_of(std::size_t cluster) const { return *policies_.at(cluster); }
  std::size_t cluster_count() const noexcept { return policies_.size(); }
  std::size_t cluster_of(std::size_t rank) const noexcept { return ranks_[rank].cluster; }

  // A round of engine-stats reads, indexed by rank. Each good reading replaces the rank's engine view; the
  // policy also gets the full snapshot of every rank's latest numbers (the engine-stats baseline replaces
  // its local estimate with it, as vLLM's client does). dplb's own counts are never touched by it.
  void publish_engine_stats(std::span<const engine_reading> round);
  engine_status engine_stats_of(std::size_t rank) const;  // {} for a rank not (yet) in the balancer

  // Queueing (only with max_inflight_per_rank > 0).
  bool queueing() const noexcept { return limits_.max_inflight_per_rank > 0; }
  const queue_limits& limits() const noexcept { return limits_; }
  // A request's cost as it is counted: every request costs at least one token, so that one whose cost is
  // unknown still weighs on its rank.
  static request_cost at_least_one_token(request_cost cost) noexcept;
  // Whether a queued request may pass over ranks still prefilling a long prompt (queue_limits): its own
  // pick_context::prompt_tokens make it long.
  bool spreads(const pick_context& request) const noexcept { return queueing() && prefills_long(request); }
  std::chrono::milliseconds long_prompt_hold() const noexcept { return limits_.long_prompt_hold; }
  // Takes a slot at once (served), or enqueues `deliver` in the place `share` gives it (queued), or
  // refuses: the queue is full, its tenant has max_queued waiters, or no rank is usable. A request whose
  // place is on a full rank waits for it even while other ranks have room (see queue_limits); if it cannot
  // wait, it takes a slot elsewhere rather than a refusal. The storage that `request` views must outlive
  // the wait (see waiter).
  wait_outcome acquire_or_wait(const pick_context& request, request_cost cost, const queue_share& share,
                               std::function<void(rank_lease)> deliver);
  // Removes a waiter that gave up; false when it was already served (its lease is on the way).
  bool cancel_wait(std::uint64_t waiter_id);
  // Serves the queue again without any other event: a waiter whose placement_wait ran out while nothing
  // was released or arrived then takes a slot free elsewhere. A waiting request calls it once its own
  // placement_wait is over, so that no waiter outlasts it for want of an event.
  void reconsider();
  std::chrono::milliseconds placement_wait() const noexcept { return limits_.placement_wait; }
  // How long a request with this share holds out for its place (see queue_share::max_wait): the session that
  // waits calls reconsider() when it is over.
  std::chrono::milliseconds placement_wait(const queue_share& share) const noexcept;
  std::size_t waiting() const noexcept { return waiting_.load(std::memory_order_relaxed); }
  std::size_t waiting_of(std::uint64_t tenant) const;  // one tenant's waiters, over every cluster's queue
  std::size_t queue_bands() const;  // priority bands with waiters, summed over the clusters' queues (for tests)
  // For shutdown, once the threads that serve the waiters have stopped: drops every waiter without
  // delivering to it (destroying its `deliver`) and queues none from then on, so that no release after
  // this calls a `deliver`, whose executor may be destroyed by then.
  void close();

 private:
  friend class rank_lease;
  using clock = std::chrono::steady_clock;
  void release(std::size_t rank, request_cost cost) noexcept;
  void release_cost(std::size_t rank, request_cost cost) noexcept;
  void prompt_done(std::size_t rank, request_cost prefilled) noexcept;
  bool prefills_long(const pick_context& request) const noexcept {
    return limits_.long_prompt_tokens > 0 && request.prompt_tokens >= limits_.long_prompt_tokens &&
           !request.prefilled_elsewhere;
  }
  std::optional<std::size_t> place_session_locked(std::string_view key);
  // Counts the request on the rank it picks, and marks `cost` long_prompt when it is.
  std::optional<std::size_t> pick_locked(const pick_context& request, request_cost& cost);
  bool has_room_locked(std::size_t rank) const noexcept;
  bool usable_with_room_locked(std::size_t rank) const noexcept;
  bool cluster_has_room_locked(std::size_t cluster) const noexcept;
  // room_matters: false for policy::preferred's view, where a full rank is usable.
  void refresh_view_locked(const pick_context& request, bool room_matters = true);
  // Where the request belongs, or nullopt once its hold is over (queue_lines.hpp, line_kind::preferring).
  std::optional<place> preferred_locked(const pick_context& request, clock::time_point hold_until,
                                        clock::time_point now);
  // Counts the request on `rank` (the second half of a pick).
  // `by_ledger`: the shared ledger chose and counted it already (acquire_chosen), so the listener is not told.
  void count_pick_locked(std::size_t rank, const pick_context& request, request_cost& cost,
                         bool by_ledger = false) noexcept;
  // A waiter of `rank`'s preferring line takes its slot, its place judged when it joined the line.
  void take_place_locked(std::size_t rank, waiter& w);
  bool untried_usable_locked(const pick_context& request) const noexcept;
  std::optional<std::size_t> pick_from_shared_line_locked(const pick_context& request, request_cost& cost,
                                                          clock::time_point since, clock::time_point now);

  // The queue (balancer_queue.cpp).
  waiting_line& line_locked(const line_ref& line) noexcept;
  void enqueue_locked(waiter w, const line_ref& line, std::size_t cluster, const queue_share& share);
  waiting_line::node leave_locked(cluster_queue& queue, waiting_line& line, waiting_line::iterator at);
  void move_locked(waiting_line& from, waiting_line::iterator at, const line_ref& to);
  // Serves the cluster's waiters that its room suits. `freed`: the rank whose room or state the event changed
  // (its own lines are looked at only then). Never throws: an allocation that fails stops it between two
  // waiters, each still in its line, to be served at the next event.
  void serve_locked(std::size_t cluster, std::optional<std::size_t> freed, handoffs& ready) noexcept;
  void serve_rounds_locked(std::size_t cluster, std::optional<std::size_t> freed, handoffs& ready,
                           clock::time_point now);
  void end_holds_locked(cluster_queue& queue, clock::time_point now);
  void give_up_places_on_locked(std::size_t rank);
  void turn_away_hopeless_retries_locked(cluster_queue& queue, handoffs& ready);
  void turn_away_stranded_locked(std::size_t rank, handoffs& ready);
  wait_state refusal_locked(const pick_context& request, const queue_share& share) const;
  std::size_t waiting_of_locked(std::uint64_t tenant) const;
  void count_waiting_locked() noexcept { waiting_.store(places_.size(), std::memory_order_relaxed); }

  // A cache line per rank: each rank's count is written by every request on it, and ranks side by side
  // on one line would make the threads serving different ranks invalidate each other's reads.
  struct alignas(64) rank_state {
    std::atomic<std::uint32_t> inflight{0};
    std::atomic<std::uint32_t> others{0};  // the other replicas' requests, as the shared ledger last said
    std::atomic<std::uint64_t> picks{0};
    std::atomic<std::uint64_t> cost{0};         // tokens: prompts not yet prefilled plus generation
    std::atomic<std::uint64_t> prompt_cost{0};  // the prompt part of `cost`
    std::atomic<std::uint32_t> long_prefills{0};  // long prompts (queue_limits) not yet prefilled
    std::atomic<std::uint8_t> flags{0};
    std::atomic<std::uint32_t> weight{1};
    std::size_t cluster = 0;  // written before the rank is published, never after
  };
  // What only the lock guards: rare writes, read by every pick.
  struct rank_detail {
    bool engine_ever = false;  // a good engine-stats read arrived once
    engine_load engine;        // at the last good read
    clock::time_point read_at{};
    std::uint32_t inflight_at_read = 0;
    clock::time_point ramp_until{};  // slow start ends; epoch: not ramping
    waiting_line pinned;             // its cluster's waiters for this rank only
    waiting_line preferring;         // its cluster's waiters whose place is this rank, while it is full
  };
  policy& policy_for_rank(std::size_t rank) { return *policies_[ranks_[rank].cluster]; }

  mutable std::mutex pick_mutex_;
  std::vector<std::unique_ptr<policy>> policies_;  // one per cluster
  std::optional<affinity_ring> affinity_;          // with --affinity-header
  double affinity_bound_ = 1.25;
  routing_stats* routing_stats_ = nullptr;
  release_listener* listener_ = nullptr;
  queue_limits limits_;
  rank_timing timing_;
  std::vector<cluster_queue> clusters_;  // one per cluster; guarded by pick_mutex_
  std::unordered_map<std::uint64_t, waiter_place> places_;  // every waiter, by id; guarded by pick_mutex_
  std::vector<bool> passed_over_;   // scratch for pick_from_shared_line_locked(); guarded by pick_mutex_
  bool hears_releases_ = false;  // some cluster's policy hears releases (fixed at construction)
  std::atomic<std::size_t> waiting_{0};    // waiters, pinned or not, for metrics; never decides anything
  std::uint64_t next_waiter_id_ = 1;       // guarded by pick_mutex_
  bool closed_ = false;                    // guarded by pick_mutex_
  std::size_t ramping_ = 0;                // ranks in slow start; guarded by pick_mutex_
  bool stats_seen_ = false;                // a good engine-stats read arrived; guarded by pick_mutex_
  // Allocated once for the capacity, never moved (atomics are not movable, and readers hold no lock);
  // ranks_[0, rank_count_) are in use. rank_count_ only grows, under pick_mutex_.
  std::size_t capacity_;
  std::unique_ptr<rank_state[]> ranks_;
  std::atomic<std::size_t> rank_count_{0};
  std::vector<rank_detail> detail_; // rank_count_ of them; guarded by pick_mutex_
  std::vector<rank_view> view_;     // scratch for choose(); guarded by pick_mutex_
  std::vector<engine_load> loads_;  // scratch for on_engine_stats(); guarded by pick_mutex_
  std::span<rank_state> ranks_in_use() const noexcept { return {ranks_.get(), rank_count()}; }
};

}  // namespace dplb::balancer
