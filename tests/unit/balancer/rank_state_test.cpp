// What a policy sees beyond dplb's own counts: weights, independent state flags, engine stats, token
// costs, pinned requests and slow start; and that the exactness of bursts survives all of them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/least_load.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "fifo_wait.hpp"
#include "picks_per_rank.hpp"

using namespace std::chrono_literals;
using dplb::balancer::balancer;
using dplb::balancer::engine_load;
using dplb::balancer::engine_reading;
using dplb::balancer::rank_flag;
using dplb::balancer::make_policy;
using dplb::balancer::pick_context;
using dplb::balancer::rank_lease;
using dplb::balancer::test::picks_per_rank;
using dplb::balancer::test::acquire_or_wait_fifo;

namespace {

// A round of engine reads, all good, taken now, before any pick dplb makes from here on.
std::vector<engine_reading> reads(const balancer& b, const std::vector<engine_load>& loads) {
  std::vector<engine_reading> round(loads.size());
  for (std::size_t r = 0; r < loads.size(); ++r) {
    round[r].good = true;
    round[r].load = loads[r];
    round[r].inflight_at_read = b.inflight(r);
    round[r].read_at = std::chrono::steady_clock::now();
  }
  return round;
}

}  // namespace

TEST_CASE("every policy splits a burst in the ratio of the weights", "[balancer][weights]") {
  const auto policy_name =
      GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens", "engine-stats");
  balancer b(3, make_policy(policy_name));
  b.set_weight(0, 3);
  b.set_weight(1, 1);
  b.set_weight(2, 2);
  std::vector<rank_lease> held;
  for (int i = 0; i < 600; ++i) held.push_back(b.acquire());
  INFO(policy_name);
  CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{300, 100, 200});
}

TEST_CASE("requests that finish one after the other still split by weight", "[balancer][weights]") {
  // Nothing is ever in flight when the next request comes: every pick is a tie, and ties follow the weights
  // (scoring (inflight + 1) / weight instead would send every one of them to the heaviest rank).
  const auto policy_name = GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens");
  balancer b(2, make_policy(policy_name));
  b.set_weight(0, 3);
  std::vector<std::size_t> order;
  for (int i = 0; i < 8; ++i) order.push_back(b.acquire().rank());
  INFO(policy_name);
  CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{6, 2});
  CHECK(order == std::vector<std::size_t>{0, 0, 1, 0, 0, 0, 1, 0});  // interleaved, never a run of the light rank
}

TEST_CASE("random honours weights too, in expectation", "[balancer][weights]") {
  balancer b(2, make_policy("random"));
  b.set_weight(0, 4);
  for (int i = 0; i < 20'000; ++i) b.acquire();
  CHECK((b.picks(0) > 15'400 && b.picks(0) < 16'600));  // 16,000 +- 3.75%
}

TEST_CASE("weighted round-robin interleaves instead of sending runs", "[balancer][weights]") {
  balancer b(2, make_policy("round-robin"));
  b.set_weight(0, 2);
  std::vector<std::size_t> order;
  for (int i = 0; i < 6; ++i) order.push_back(b.acquire().rank());
  CHECK(order == std::vector<std::size_t>{0, 1, 0, 0, 1, 0});
}

TEST_CASE("state flags are independent: clearing one never readmits a rank another keeps out", "[balancer][flags]") {
  balancer b(2, make_policy("least-inflight"));
  b.set_flag(0, rank_flag::draining, true);   // the admin drains it
  b.set_flag(0, rank_flag::unhealthy, true);  // and it fails its health checks
  b.set_flag(0, rank_flag::unhealthy, false); // it is healthy again: still draining
  CHECK_FALSE(b.usable(0));
  CHECK(b.flags(0) == rank_flag::draining);
  for (int i = 0; i < 4; ++i) CHECK(b.acquire().rank() == 1);
  b.set_flag(0, rank_flag::draining, false);
  CHECK(b.usable(0));
  CHECK(b.acquire().rank() == 0);
}

TEST_CASE("least-load: engine stats raise a rank's load but never lower it below dplb's count",
          "[balancer][least-load]") {
  balancer b(4, make_policy("least-load"));
  SECTION("a burst on idle ranks stays exact while stale reads arrive in the middle of it") {
    std::vector<rank_lease> held;
    for (int i = 0; i < 100; ++i) held.push_back(b.acquire());
    // The engines have seen only part of the burst so far (requests in transit): the read is below
    // dplb's counts, so it must change nothing.
    b.publish_engine_stats(reads(b, {{.waiting = 10, .running = 0}, {.waiting = 3, .running = 0},
                                     {.waiting = 0, .running = 0}, {.waiting = 25, .running = 0}}));
    for (int i = 0; i < 156; ++i) held.push_back(b.acquire());
    CHECK(picks_per_rank(b) == std::vector<std::uint64_t>(4, 64));
  }
  SECTION("load dplb never saw (another replica, direct clients) steers new requests away") {
    b.publish_engine_stats(reads(b, {{.waiting = 0, .running = 40}, {.waiting = 0, .running = 0},
                                     {.waiting = 0, .running = 0}, {.waiting = 0, .running = 20}}));
    std::vector<rank_lease> held;
    for (int i = 0; i < 40; ++i) held.push_back(b.acquire());
    // Ranks 1 and 2 fill up to rank 3's 20 first; then the three share the load, rank 0 still out.
    CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{0, 20, 20, 0});
    for (int i = 0; i < 3; ++i) held.push_back(b.acquire());
    CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{0, 21, 21, 1});
  }
  SECTION("load the engine reported beyond dplb's counts stays on top of dplb's later picks") {
    b.publish_engine_stats(reads(b, {{.waiting = 0, .running = 5}, {.waiting = 0, .running = 5},
                                     {.waiting = 0, .running = 5}, {.waiting = 0, .running = 5}}));
    std::vector<rank_lease> held;
    for (int i = 0; i < 8; ++i) held.push_back(b.acquire());
    CHECK(picks_per_rank(b) == std::vector<std::uint64_t>(4, 2));  // 5 unseen by dplb on each: still a four-way rotation
  }
  SECTION("waiting requests on a rank whose KV cache is over half full weigh more") {
    // Same running + waiting everywhere; rank 0's KV cache is 90% full with 4 waiting: 4 + 6*4*0.4 = 13.6.
    b.publish_engine_stats(reads(b, {{.waiting = 4, .running = 0, .kv_cache_usage = 0.9},
                                     {.waiting = 4, .running = 0, .kv_cache_usage = 0.4},
                                     {.waiting = 4, .running = 0, .kv_cache_usage = 0.5},
                                     {.waiting = 4, .running = 0, .kv_cache_usage = 0.0}}));
    std::vector<rank_lease> held;
    for (int i = 0; i < 27; ++i) held.push_back(b.acquire());
    CHECK(b.picks(0) == 0);
    CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{0, 9, 9, 9});
  }
  SECTION("stale numbers are ignored: the policy falls back to dplb's own counts") {
    auto round = reads(b, {{.waiting = 0, .running = 100}, {}, {}, {}});
    round[0].read_at -= 2s;  // older than the default bound of 1 s
    b.publish_engine_stats(round);
    std::vector<rank_lease> held;
    for (int i = 0; i < 8; ++i) held.push_back(b.acquire());
    CHECK(picks_per_rank(b) == std::vector<std::uint64_t>(4, 2));
  }
  SECTION("a failed read keeps the last good numbers, which age out") {
    b.publish_engine_stats(reads(b, {{.waiting = 0, .running = 100}, {}, {}, {}}));
    std::vector<engine_reading> failed(4);
    b.publish_engine_stats(failed);
    CHECK(b.engine_stats_of(0).ever);
    CHECK(b.engine_stats_of(0).load.running == 100);
    CHECK(b.engine_stats_of(1).ever);
    CHECK(b.acquire().rank() != 0);
  }
}

TEST_CASE("least-load's score: dplb's live count plus what the engine had beyond dplb's, plus KV pressure",
          "[balancer][least-load]") {
  dplb::balancer::least_load policy(6.0);
  dplb::balancer::rank_view h;
  h.inflight = 7;
  CHECK(policy.load_of(h) == 7);  // no stats
  h.engine.fresh = true;
  h.engine.load = {.waiting = 2, .running = 3, .kv_cache_usage = 0.75};
  h.engine.inflight_at_read = 6;
  // The engine saw 5 of dplb's 6 (one in transit): nothing unseen; vLLM's max(7, 5) + 6 * 2 * 0.25.
  CHECK(policy.load_of(h) == Approx(7 + 3));
  // dplb had nothing there at the read: the engine's 5 are someone else's.
  h.engine.inflight_at_read = 0;
  CHECK(policy.load_of(h) == Approx(7 + 5 + 3));
  dplb::balancer::least_load no_kv(0.0);
  CHECK(no_kv.load_of(h) == 12);
  h.engine.fresh = false;  // stale: dplb's count alone
  CHECK(policy.load_of(h) == 7);
}

TEST_CASE("a pinned request goes to its rank only, and waits in that rank's own queue", "[balancer][pinned]") {
  balancer b(3, make_policy("least-inflight"), {.max_inflight_per_rank = 1, .max_waiting = 10});
  pick_context pinned;
  pinned.pinned_rank = 2;
  auto first = b.acquire(pinned);
  REQUIRE(first);
  CHECK(first.rank() == 2);
  // Rank 2 is full: a pinned request waits, though ranks 0 and 1 have room.
  std::vector<rank_lease> delivered;
  std::uint64_t id = 0;
  bool queued = false;
  CHECK_FALSE(acquire_or_wait_fifo(b, pinned, {}, [&](rank_lease l) { delivered.push_back(std::move(l)); }, id, queued));
  CHECK(queued);
  CHECK(b.waiting() == 1);
  // Unpinned requests still flow to the ranks with room: the pinned waiter holds nobody else up.
  auto other = b.acquire();
  REQUIRE(other);
  CHECK(other.rank() != 2);
  first.release();
  REQUIRE(delivered.size() == 1);
  CHECK(delivered[0].rank() == 2);
  CHECK(b.waiting() == 0);
  // A pinned request to a rank that is not usable is refused, not sent elsewhere.
  b.set_flag(1, rank_flag::ejected, true);
  pinned.pinned_rank = 1;
  CHECK_FALSE(b.acquire(pinned));
  CHECK_FALSE(acquire_or_wait_fifo(b, pinned, {}, [](rank_lease) {}, id, queued));
  CHECK_FALSE(queued);
}

TEST_CASE("the oldest waiter gets a freed slot, pinned or not", "[balancer][pinned]") {
  balancer b(1, make_policy("least-inflight"), {.max_inflight_per_rank = 1, .max_waiting = 10});
  auto busy = b.acquire();
  std::vector<int> order;
  std::vector<rank_lease> delivered;
  std::uint64_t id = 0;
  bool queued = false;
  pick_context pinned;
  pinned.pinned_rank = 0;
  acquire_or_wait_fifo(b, {}, {}, [&](rank_lease l) { order.push_back(1), delivered.push_back(std::move(l)); }, id, queued);
  acquire_or_wait_fifo(b, pinned, {}, [&](rank_lease l) { order.push_back(2), delivered.push_back(std::move(l)); }, id, queued);
  acquire_or_wait_fifo(b, {}, {}, [&](rank_lease l) { order.push_back(3), delivered.push_back(std::move(l)); }, id, queued);
  // Releasing a delivered lease serves the next waiter, whose delivery lands in `delivered` again.
  const auto release_delivered = [&] {
    auto taken = std::move(delivered);
    delivered.clear();
    taken.clear();
  };
  busy.release();
  CHECK(order == std::vector<int>{1});
  release_delivered();
  CHECK(order == std::vector<int>{1, 2});
  release_delivered();
  CHECK(order == std::vector<int>{1, 2, 3});
}

TEST_CASE("slow start: a readmitted rank ramps up from a tenth of its weight", "[balancer][slow-start]") {
  balancer b(2, make_policy("least-inflight"), {}, {.slow_start = 60s});
  b.set_flag(1, rank_flag::unhealthy, true);
  std::vector<rank_lease> held;
  for (int i = 0; i < 30; ++i) held.push_back(b.acquire());
  CHECK(b.picks(0) == 30);
  b.set_flag(1, rank_flag::unhealthy, false);  // back: weight 0.1 for now
  for (int i = 0; i < 33; ++i) held.push_back(b.acquire());
  // At a tenth of its weight, rank 1 counts as ten times as loaded as it is: it takes a few of these 33
  // (n / 0.1 against rank 0's 30 and up), not the 30 it would take at full weight.
  CHECK(b.picks(1) >= 1);
  CHECK(b.picks(1) <= 6);
  // Without slow start the same rank would take half of them at once.
  balancer plain(2, make_policy("least-inflight"));
  plain.set_flag(1, rank_flag::unhealthy, true);
  std::vector<rank_lease> held_plain;
  for (int i = 0; i < 30; ++i) held_plain.push_back(plain.acquire());
  plain.set_flag(1, rank_flag::unhealthy, false);
  for (int i = 0; i < 33; ++i) held_plain.push_back(plain.acquire());
  CHECK(plain.picks(1) >= 30);
}

namespace {

struct listening_policy final : dplb::balancer::policy {
  std::optional<std::size_t> choose(const pick_context&, std::span<const dplb::balancer::rank_view> ranks) override {
    for (std::size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i].usable) return i;
    return std::nullopt;
  }
  std::string_view name() const noexcept override { return "listening"; }
  bool hears_releases() const noexcept override { return true; }
  void on_release(std::size_t rank) override { releases.push_back(rank); }
  void on_state_change(std::size_t rank, std::uint8_t flags) override { changes.emplace_back(rank, flags); }
  std::vector<std::size_t> releases;
  std::vector<std::pair<std::size_t, std::uint8_t>> changes;
};

}  // namespace

TEST_CASE("a policy that asks hears every release and every state change", "[balancer]") {
  auto owned = std::make_unique<listening_policy>();
  auto& policy = *owned;
  balancer b(2, std::move(owned));
  b.acquire().release();
  b.set_flag(0, rank_flag::draining, true);
  b.acquire().release();
  b.set_flag(0, rank_flag::draining, true);  // no change: not heard
  b.set_flag(0, rank_flag::draining, false);
  CHECK(policy.releases == std::vector<std::size_t>{0, 1});
  CHECK(policy.changes == std::vector<std::pair<std::size_t, std::uint8_t>>{{0, rank_flag::draining}, {0, 0}});
}
