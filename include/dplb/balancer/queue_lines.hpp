#pragma once
// The parts of dplb's queue (--max-inflight-per-rank), one rule each; balancer_queue.cpp serves them.
//
// Each cluster has its own queue (cluster_queue): its own fair order, so what a tenant does in one cluster (a
// P/D deployment's decode pool) moves nobody's turn in another (the prefill pool). A cluster's waiters stand in
// one of its lines (line_kind), each soonest first by queue_key. A freed slot goes to the soonest waiter of its
// cluster that it suits; an event (a release, an arrival, a rank's change) looks only at the lines it can
// change, never at every line.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "dplb/balancer/fair_order.hpp"
#include "dplb/balancer/rank_lease.hpp"
#include "dplb/balancer/waiter.hpp"

namespace dplb::balancer {

// A waiter's turn in its cluster's queue: the lowest priority value, then the earliest start tag (its
// tenant's fair share), then the earliest arrival. Fixed when it queues, unique (ids are).
struct queue_key {
  std::int64_t priority = 0;
  double start = 0;
  std::uint64_t id = 0;

  static queue_key of(const waiter& w) noexcept { return {w.tag.priority, w.tag.start, w.id}; }
  friend bool operator<(const queue_key& a, const queue_key& b) noexcept {
    return std::tie(a.priority, a.start, a.id) < std::tie(b.priority, b.start, b.id);
  }
};

// The three lines a waiter can stand in:
//  - shared: any usable rank of its cluster with room suits it, in its turn (a retry: one it has not tried; a
//    long prompt: one not prefilling another, for at most queue_limits::long_prompt_hold). Such a waiter that
//    the room does not suit is passed over for the call, so those behind it may take that room.
//  - pinned: the client named its rank (X-data-parallel-rank): only that rank's slots suit it.
//  - preferring: its place (its prefix's rank, its session's rank on the ring: policy::preferred, judged as if
//    no rank were full and within the load bound) is full; it holds out for that rank's next slot while later
//    requests take slots freed elsewhere, until its hold ends (place_hold) or the rank becomes unusable: then
//    it stands in the shared line. The rank's next slot is its own without another judgement or pick
//    (policy::placed), so serving it reads no other rank.
enum class line_kind : std::uint8_t { shared, pinned, preferring };
struct line_ref {
  line_kind kind = line_kind::shared;
  std::size_t index = 0;  // shared: the cluster; pinned and preferring: the rank
};

// One line, soonest first. A waiter moves between lines as its node: a move allocates nothing, so a serve
// that only moves and removes waiters cannot fail halfway through a move.
class waiting_line {
  using map = std::map<queue_key, waiter>;

 public:
  using node = map::node_type;
  using iterator = map::iterator;

  // A waiter's node, made before any line changes (it is what allocates).
  static node make_node(waiter w) {
    map one;
    one.emplace(queue_key::of(w), std::move(w));
    return one.extract(one.begin());
  }

  bool empty() const noexcept { return waiters_.empty(); }
  std::size_t size() const noexcept { return waiters_.size(); }
  iterator begin() noexcept { return waiters_.begin(); }
  iterator end() noexcept { return waiters_.end(); }
  iterator find(const queue_key& key) { return waiters_.find(key); }
  void put(node&& n) { waiters_.insert(std::move(n)); }
  node take(iterator at) { return waiters_.extract(at); }

 private:
  map waiters_;
};

// Where a waiter stands, by its id (cancel_wait, the end of its hold).
struct waiter_place {
  std::size_t cluster = 0;
  line_ref line;
  queue_key key;
};

// Until when each waiter that may have a place (not pinned, not a retry) holds out for it: the sooner of
// queue_limits::placement_wait and half its own longest wait (queue_share::max_wait), from its arrival. Kept
// soonest first, so that ending the holds that are over costs nothing while none is.
using place_holds = std::set<std::pair<std::chrono::steady_clock::time_point, std::uint64_t>>;

// One cluster's queue.
struct cluster_queue {
  fair_order order;             // its own virtual clock per priority band, its tenants' counts
  waiting_line shared;          // its waiters for any of its ranks (pinned and preferring lines are per rank)
  place_holds holds;            // of its waiters, in any line
  std::vector<std::size_t> ranks;  // its ranks, by global number
  std::size_t waiting = 0;      // in any of its lines
};

// Slots assigned under the balancer's lock, handed over after it (a hand-over may take the lock again). Every
// one is handed over, even when the call that assigned them throws: it lives outside the lock's scope, and
// its destructor hands over what is left. Room for a hand-over is made before its waiter leaves its line, so a
// failed allocation leaves that waiter where it stood.
class handoffs {
 public:
  handoffs() = default;
  handoffs(const handoffs&) = delete;
  handoffs& operator=(const handoffs&) = delete;
  ~handoffs() { hand_over(); }

  void make_room();
  void add(std::function<void(rank_lease)>&& deliver, rank_lease lease) noexcept {
    items_.push_back(item{std::move(deliver), std::move(lease)});  // room was made: does not allocate
  }
  // A hand-over that throws (a post that cannot allocate) releases the lease it was given as the exception
  // leaves it; the others are still handed over: one failure must neither end the process (a release is
  // noexcept) nor strand them.
  void hand_over() noexcept;

 private:
  struct item {
    std::function<void(rank_lease)> deliver;
    rank_lease lease;
  };
  std::vector<item> items_;
};

// For tests: the `n`th handoffs::make_room() from now on this thread (0: the next) throws std::bad_alloc, as an
// allocation failing there would. Negative: none.
void fail_handoff_room_after(int n) noexcept;

}  // namespace dplb::balancer
