// A queued request is a whole request (--max-inflight-per-rank): a waiter keeps its prefix chain and
// session key, and one whose place (the rank holding its prefix, its session's rank) is full waits for
// that rank while a later waiter takes a slot freed elsewhere. Where placement does not matter the queue
// stays FIFO, and nobody waits for a place for ever: a place over the load bound, on a rank that went
// down, or held out for beyond the placement wait, no longer counts.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/least_inflight.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/balancer/prefix_index.hpp"
#include "fifo_wait.hpp"
#include "picks_per_rank.hpp"

using namespace dplb::balancer;
using namespace std::chrono_literals;
using dplb::balancer::test::acquire_or_wait_fifo;

namespace {

std::vector<prefix_hash> group_chain(char group, std::string_view tail = "") {
  prefix_chain_builder b(0);
  b.feed(std::string(8 * prefix_block_bytes, group));
  b.feed(tail);
  return b.take();
}

pick_context with_chain(const std::vector<prefix_hash>& chain) {
  pick_context c;
  c.prefix_chain = chain;
  return c;
}

pick_context with_session(const std::string& key) {
  pick_context c;
  c.session_key = key;
  return c;
}

// Waiters and the leases handed to them, by the order in which they queued.
struct waiters {
  explicit waiters(balancer& owner) : b(owner) {}
  // Drops the waiters left before `delivered` goes: a lease the test still holds, released after this, must
  // not deliver into it (a waiter holding out for its place is served by that place's release alone).
  ~waiters() { b.close(); }
  waiters(const waiters&) = delete;
  waiters& operator=(const waiters&) = delete;
  balancer& b;
  std::vector<std::uint64_t> ids;
  std::vector<std::pair<std::size_t, rank_lease>> delivered;  // (waiter, lease)

  // Queues one request (it must find no slot that suits it); returns its index.
  std::size_t queue(const pick_context& request) {
    const std::size_t index = ids.size();
    std::uint64_t id = 0;
    bool queued = false;
    auto now = acquire_or_wait_fifo(b, request, {}, [this, index](rank_lease l) { delivered.emplace_back(index, std::move(l)); },
                                 id, queued);
    REQUIRE_FALSE(now);
    REQUIRE(queued);
    ids.push_back(id);
    return index;
  }
  std::optional<std::size_t> rank_of(std::size_t waiter) const {
    for (const auto& [w, lease] : delivered) {
      if (w == waiter && lease) return lease.rank();
    }
    return std::nullopt;
  }
};

std::unique_ptr<policy> prefix_policy() { return std::make_unique<prefix_aware>(prefix_aware_options{}, nullptr); }

// Prefix group a placed on rank 0, group x on rank 1: both ranks full under --max-inflight-per-rank 1.
struct a_on_0_x_on_1 {
  explicit a_on_0_x_on_1(balancer& b)
      : a(group_chain('a')), held_a(b.acquire(with_chain(a))), held_x(b.acquire(with_chain(group_chain('x')))) {
    REQUIRE(held_a.rank() == 0);
    REQUIRE(held_x.rank() == 1);
  }
  const std::vector<prefix_hash> a;
  rank_lease held_a;
  rank_lease held_x;
};

}  // namespace

TEST_CASE("a queued request waits for the rank holding its prefix while a later one takes the slot freed elsewhere",
          "[balancer][queue][prefix]") {
  balancer b(2, prefix_policy(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16});
  const auto a = group_chain('a');
  const auto c = group_chain('c');
  // Group a's prefix goes to rank 0, group c's to rank 1; each then holds its rank's only slot.
  auto held_a = b.acquire(with_chain(a));
  auto held_c = b.acquire(with_chain(c));
  REQUIRE(held_a.rank() == 0);
  REQUIRE(held_c.rank() == 1);

  waiters w(b);
  const auto first = w.queue(with_chain(a));   // its place, rank 0, is full
  const auto second = w.queue(with_chain(c));  // its place, rank 1, is full
  CHECK(b.waiting() == 2);
  // Rank 1 frees: it is not the oldest waiter's place, and the next waiter's it is.
  held_c.release();
  REQUIRE(w.delivered.size() == 1);
  CHECK(w.rank_of(second) == 1u);
  CHECK_FALSE(w.rank_of(first));
  CHECK(b.waiting() == 1);
  // Rank 0 frees: the first waiter, still on its prefix, gets it.
  held_a.release();
  REQUIRE(w.delivered.size() == 2);
  CHECK(w.rank_of(first) == 0u);
  CHECK(b.waiting() == 0);
  w.delivered.clear();
  CHECK(b.inflight(0) == 0);
  CHECK(b.inflight(1) == 0);
}

TEST_CASE("a queued session waits for its own rank on the affinity ring", "[balancer][queue][affinity]") {
  balancer b(2, make_policy("least-inflight"), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16});
  b.enable_affinity(1.25, nullptr);
  // Two session keys that the ring puts on different ranks.
  std::string on_rank[2];
  for (int i = 0; on_rank[0].empty() || on_rank[1].empty(); ++i) {
    REQUIRE(i < 1000);
    const auto key = "session-" + std::to_string(i);
    auto lease = b.acquire(with_session(key));
    REQUIRE(lease);
    if (on_rank[lease.rank()].empty()) on_rank[lease.rank()] = key;
  }
  auto held0 = b.acquire(with_session(on_rank[0]));
  auto held1 = b.acquire(with_session(on_rank[1]));
  REQUIRE(held0.rank() == 0);
  REQUIRE(held1.rank() == 1);

  waiters w(b);
  const auto first = w.queue(with_session(on_rank[0]));
  const auto second = w.queue(with_session(on_rank[1]));
  held1.release();
  REQUIRE(w.delivered.size() == 1);
  CHECK(w.rank_of(second) == 1u);
  held0.release();
  REQUIRE(w.delivered.size() == 2);
  CHECK(w.rank_of(first) == 0u);
}

TEST_CASE("a request arriving at a full place waits for it although another rank has room",
          "[balancer][queue][prefix]") {
  balancer b(2, prefix_policy(), queue_limits{.max_inflight_per_rank = 2, .max_waiting = 16});
  a_on_0_x_on_1 placed(b);  // something else on rank 1
  const auto& a = placed.a;
  auto& warm = placed.held_a;
  auto second_a = b.acquire(with_chain(group_chain('a', "second")));
  REQUIRE(second_a.rank() == 0);  // rank 0 now full, rank 1 has room; 2 + 1 <= ceil(1.25 * 4 / 2)
  waiters w(b);
  const auto waiting = w.queue(with_chain(a));
  CHECK(b.inflight(1) == 1);
  // A request with nothing to follow takes rank 1's room: the waiter does not want it.
  std::uint64_t id = 0;
  bool queued = false;
  const auto y = group_chain('y');
  auto unrelated = acquire_or_wait_fifo(b, with_chain(y), {}, [](rank_lease) {}, id, queued);
  REQUIRE(unrelated);
  CHECK(unrelated.rank() == 1);
  warm.release();
  CHECK(w.rank_of(waiting) == 0u);
}

TEST_CASE("where placement does not matter, the queue is FIFO and a burst lands exactly even",
          "[balancer][queue]") {
  const auto name = GENERATE(as<std::string>{}, "least-inflight", "prefix-aware");
  INFO(name);
  balancer b(4, name == "prefix-aware" ? prefix_policy() : make_policy(name),
             queue_limits{.max_inflight_per_rank = 4, .max_waiting = 256});
  // Prompts that share nothing: prefix-aware has no place for them either.
  std::vector<std::vector<prefix_hash>> chains;
  for (prefix_hash seed = 1; seed <= 64; ++seed) {
    prefix_chain_builder builder(seed);  // a seed of its own: nothing in common with the others
    builder.feed(std::string(4 * prefix_block_bytes, 'p'));
    chains.push_back(builder.take());
  }
  std::vector<rank_lease> held;
  for (int i = 0; i < 16; ++i) held.push_back(b.acquire(with_chain(chains[static_cast<std::size_t>(i)])));
  CHECK(test::picks_per_rank(b) == std::vector<std::uint64_t>{4, 4, 4, 4});
  waiters w(b);
  w.delivered.reserve(48);
  for (std::size_t i = 16; i < 64; ++i) w.queue(with_chain(chains[i]));
  // Slots free one at a time, rank after rank; each goes to the oldest waiter.
  for (std::size_t round = 0; round < 48; ++round) {
    auto& lease = round < held.size() ? held[round] : w.delivered[round - held.size()].second;
    lease.release();
    REQUIRE(w.delivered.size() == round + 1);
    CHECK(w.delivered[round].first == round);
  }
  CHECK(test::picks_per_rank(b) == std::vector<std::uint64_t>{16, 16, 16, 16});
}

TEST_CASE("a place over the load bound does not hold a request back", "[balancer][queue][prefix]") {
  balancer b(4, prefix_policy(), queue_limits{.max_inflight_per_rank = 4, .max_waiting = 16});
  const auto a = group_chain('a');
  auto warm = b.acquire(with_chain(a));
  REQUIRE(warm.rank() == 0);
  // Pinned requests fill rank 0 while the others are idle: its 5th would be over ceil(1.25 * 5 / 4) = 2.
  std::vector<rank_lease> pinned;
  pick_context pin;
  pin.pinned_rank = 0;
  for (int i = 0; i < 3; ++i) pinned.push_back(b.acquire(pin));
  REQUIRE(b.inflight(0) == 4);
  std::uint64_t id = 0;
  bool queued = false;
  auto now = acquire_or_wait_fifo(b, with_chain(a), {}, [](rank_lease) {}, id, queued);
  REQUIRE(now);
  CHECK(now.rank() != 0);
  CHECK_FALSE(queued);
}

TEST_CASE("a waiter whose rank goes down, or who waited past the placement wait, takes any slot",
          "[balancer][queue][prefix]") {
  const auto how = GENERATE(as<std::string>{}, "rank down", "placement wait");
  INFO(how);
  const auto placement_wait = how == "rank down" ? std::chrono::milliseconds(60'000) : std::chrono::milliseconds(20);
  balancer b(3, prefix_policy(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16, .placement_wait = placement_wait});
  a_on_0_x_on_1 full(b);
  const auto& a = full.a;
  auto& held_x = full.held_x;
  auto held_y = b.acquire(with_chain(group_chain('y')));
  waiters w(b);
  const auto waiting = w.queue(with_chain(a));
  held_x.release();  // rank 1 frees; the waiter holds out for rank 0
  CHECK(w.delivered.empty());
  CHECK(b.waiting() == 1);
  if (how == "rank down") {
    b.set_flag(0, rank_flag::unhealthy, true);
  } else {
    // The wait itself is what is tested: time must pass. The next event in the cluster (here rank 2
    // freeing) finds the waiter past its placement wait.
    const auto deadline = std::chrono::steady_clock::now() + placement_wait + 5ms;
    while (std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    held_y.release();
  }
  REQUIRE(w.delivered.size() == 1);
  REQUIRE(w.rank_of(waiting));
  CHECK(*w.rank_of(waiting) != 0);
  CHECK(b.waiting() == 0);
}

TEST_CASE("a waiter holding out for its rank can give up, and a removed rank sends its waiters to any other",
          "[balancer][queue][prefix]") {
  balancer b(2, prefix_policy(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16});
  a_on_0_x_on_1 full(b);
  const auto& a = full.a;
  auto& held_x = full.held_x;
  waiters w(b);
  const auto gives_up = w.queue(with_chain(a));
  const auto stays = w.queue(with_chain(a));
  CHECK(b.cancel_wait(w.ids[gives_up]));
  CHECK_FALSE(b.cancel_wait(w.ids[gives_up]));
  CHECK(b.waiting() == 1);
  b.set_flag(0, rank_flag::removed, true);  // its place is gone: it now waits for any slot of the cluster
  CHECK(w.delivered.empty());
  held_x.release();
  CHECK(w.rank_of(stays) == 1u);
  CHECK(b.waiting() == 0);
}

TEST_CASE("a waiter past its placement wait is served when it asks again, with no other event",
          "[balancer][queue][prefix]") {
  // Long generations and no new arrivals: nothing is released or arrives while the waiter holds out for
  // its full rank, and a slot sits free elsewhere. The waiting session calls reconsider() once its
  // placement wait is over; it must then get the free slot, not wait on until its queue timeout.
  const auto placement_wait = std::chrono::milliseconds(20);
  balancer b(2, prefix_policy(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16, .placement_wait = placement_wait});
  CHECK(b.placement_wait() == placement_wait);
  a_on_0_x_on_1 full(b);
  const auto& a = full.a;
  auto& held_x = full.held_x;
  waiters w(b);
  const auto waiting = w.queue(with_chain(a));
  held_x.release();  // rank 1 frees while the waiter holds out for rank 0
  b.reconsider();    // within its placement wait: it still holds out
  CHECK(w.delivered.empty());
  // The wait itself is what is tested: time must pass.
  const auto deadline = std::chrono::steady_clock::now() + placement_wait + 5ms;
  while (std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  b.reconsider();
  REQUIRE(w.rank_of(waiting) == 1u);
  CHECK(b.waiting() == 0);
}

TEST_CASE("a request whose place is full takes a slot elsewhere rather than a refusal when the queue is full",
          "[balancer][queue][prefix]") {
  balancer b(2, prefix_policy(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 1});
  const auto a = group_chain('a');
  auto held_a = b.acquire(with_chain(a));
  REQUIRE(held_a.rank() == 0);
  waiters w(b);
  w.queue(with_chain(a));  // holds out for rank 0, and fills the queue
  std::uint64_t id = 0;
  bool queued = false;
  auto now = acquire_or_wait_fifo(b, with_chain(a), {}, [](rank_lease) {}, id, queued);
  CHECK_FALSE(queued);
  REQUIRE(now);
  CHECK(now.rank() == 1);
}

namespace {

// Places every request for model "zero" on rank 0 with 96 tokens matched, counting what the balancer asks of it.
struct placing_spy final : policy {
  std::optional<std::size_t> choose(const pick_context&, std::span<const rank_view> ranks) override {
    ++chosen;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i].usable) return i;
    }
    return std::nullopt;
  }
  std::optional<place> preferred(const pick_context& request, std::span<const rank_view>) override {
    ++judged;
    if (request.model != "zero") return std::nullopt;
    return place{0, 96};
  }
  void placed(const pick_context&, const place& at) override { places.emplace_back(at.rank, at.matched_tokens); }
  std::string_view name() const noexcept override { return "placing-spy"; }
  int chosen = 0;
  int judged = 0;
  std::vector<std::pair<std::size_t, std::uint32_t>> places;
};

}  // namespace

TEST_CASE("a waiter at its place takes the freed slot without a pick, and its policy learns the placement",
          "[balancer][queue]") {
  auto owned = std::make_unique<placing_spy>();
  auto& spy = *owned;
  balancer b(2, std::move(owned), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16});
  pick_context zero;
  zero.model = "zero";
  auto held0 = b.acquire(zero);
  auto held1 = b.acquire();
  REQUIRE(held0.rank() == 0);
  REQUIRE(held1.rank() == 1);
  REQUIRE(spy.chosen == 2);
  waiters w(b);
  const auto waiting = w.queue(zero);  // judged once on arrival: rank 0, full
  CHECK(spy.judged == 1);
  held0.release();
  CHECK(w.rank_of(waiting) == 0u);
  // Served by neither another judgement of its place nor a pick (each reads every rank): only told.
  CHECK(spy.judged == 1);
  CHECK(spy.chosen == 2);
  CHECK(spy.places == std::vector<std::pair<std::size_t, std::uint32_t>>{{0, 96}});
  CHECK(b.inflight(0) == 1);
  CHECK(b.picks(0) == 2);
}

TEST_CASE("prefix-aware counts a waiter that took its place as a pick where the prefix is, and remembers it",
          "[balancer][queue][prefix]") {
  routing_stats stats(2);
  balancer b(2, std::make_unique<prefix_aware>(prefix_aware_options{}, &stats),
             queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16});
  a_on_0_x_on_1 placed(b);
  const auto taken_before = stats.prefix_taken.load();
  const auto observed_before = stats.matched_tokens.snapshot().sample_count;
  waiters w(b);
  // The same group with a tail of its own: its tail's blocks are new to the index.
  const auto longer = group_chain('a', std::string(2 * prefix_block_bytes, 't'));
  const auto waiting = w.queue(with_chain(longer));
  placed.held_a.release();
  REQUIRE(w.rank_of(waiting) == 0u);
  CHECK(stats.prefix_taken.load() == taken_before + 1);
  const auto observed = stats.matched_tokens.snapshot();
  CHECK(observed.sample_count == observed_before + 1);
  // The index learned the tail on rank 0: the whole longer chain now matches there.
  const auto& index = dynamic_cast<const prefix_aware&>(b.active_policy()).index();
  std::vector<std::uint32_t> matched;
  index.match(longer, 2, matched);
  CHECK(matched[0] == longer.size());
  CHECK(matched[1] == 0);
}
