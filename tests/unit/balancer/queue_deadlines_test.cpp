// A waiter is answered in time: one holding out for its place takes a slot free elsewhere before its own
// deadline (queue_share::max_wait), a retry left with no untried usable rank is turned away at once, and an
// allocation failing in the middle of a serve strands nobody.
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
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/balancer/prefix_index.hpp"
#include "dplb/balancer/queue_lines.hpp"
#include "prefix_groups.hpp"
#include "recorded_waiters.hpp"

using namespace dplb::balancer;
using dplb::balancer::test::group_chain;
using dplb::balancer::test::recorded_waiters;
using dplb::balancer::test::with_chain;
using namespace std::chrono_literals;

namespace {


std::vector<rank_lease> fill(balancer& b, std::size_t ranks, std::uint32_t per_rank) {
  std::vector<rank_lease> held;
  for (std::size_t i = 0; i < ranks * per_rank; ++i) held.push_back(b.acquire());
  for (const auto& lease : held) REQUIRE(lease);
  return held;
}

}  // namespace

TEST_CASE("a waiter holding out for its full rank takes an idle one before its own deadline",
          "[balancer][queue][prefix][deadline]") {
  // The placement wait is long (half a long --queue-timeout-ms); the request's own bound (its tenant's
  // max_queue_wait_ms) is 40 ms: it holds out for its place at most 20 ms, then takes the idle rank.
  balancer b(2, std::make_unique<prefix_aware>(prefix_aware_options{}, nullptr),
             queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16, .placement_wait = 60s});
  const auto a = group_chain('a');
  auto held_a = b.acquire(with_chain(a));
  auto held_x = b.acquire(with_chain(group_chain('x')));
  REQUIRE(held_a.rank() == 0);
  REQUIRE(held_x.rank() == 1);
  queue_share share;
  share.max_wait = 40ms;
  CHECK(b.placement_wait(share) == 20ms);
  CHECK(b.placement_wait(queue_share{}) == 60s);  // no bound of its own: the placement wait
  recorded_waiters w(b);
  const auto bounded = w.queued(with_chain(a), share);
  const auto unbounded = w.queued(with_chain(a));
  held_x.release();  // rank 1 idles; both hold out for rank 0
  b.reconsider();
  CHECK(w.delivered.empty());
  // The wait itself is what is tested: time must pass.
  const auto over = std::chrono::steady_clock::now() + 20ms + 5ms;
  while (std::chrono::steady_clock::now() < over) std::this_thread::sleep_for(1ms);
  b.reconsider();  // what the waiting session does when its hold is over
  REQUIRE(w.delivered.size() == 1);
  CHECK(w.rank_of(bounded) == 1u);
  CHECK_FALSE(w.rank_of(unbounded));  // still within its placement wait
  CHECK(b.waiting() == 1);
  held_a.release();
  CHECK(w.rank_of(unbounded) == 0u);
  CHECK(b.waiting() == 0);
}

TEST_CASE("a retry whose untried ranks all go down is turned away at once, every rank being full",
          "[balancer][queue][retry]") {
  const auto flag = GENERATE(rank_flag::unhealthy, rank_flag::draining, rank_flag::removed);
  INFO(static_cast<int>(flag));
  balancer b(3, std::make_unique<least_inflight>(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 8});
  auto held = fill(b, 3, 1);
  recorded_waiters w(b);
  const std::vector<bool> tried{true, false, false};
  pick_context retry;
  retry.avoid = &tried;
  queue_share retry_share;
  retry_share.retry = true;
  const auto retried = w.queued(retry, retry_share);
  const auto plain = w.queued({});
  b.set_flag(1, flag, true);  // rank 2 is left to try
  CHECK(w.delivered.empty());
  b.set_flag(2, flag, true);  // no untried usable rank: answered now, with no slot freed anywhere
  REQUIRE(w.delivered.size() == 1);
  CHECK(w.turned_away(retried));
  CHECK(b.waiting() == 1);  // the plain waiter still waits for rank 0
  held[0].release();
  CHECK(w.rank_of(plain) == 0u);
  CHECK(b.waiting() == 0);
}

TEST_CASE("an allocation failing in the middle of a serve leaves every waiter not served in its line",
          "[balancer][queue]") {
  balancer b(2, std::make_unique<least_inflight>(), queue_limits{.max_inflight_per_rank = 3, .max_waiting = 16});
  b.set_flag(1, rank_flag::draining, true);
  auto held = fill(b, 1, 3);
  REQUIRE(b.inflight(0) == 3);
  recorded_waiters w(b);
  queue_share other;
  other.tenant = 2;
  for (int i = 0; i < 5; ++i) w.queued({}, i % 2 == 0 ? queue_share{} : other);
  REQUIRE(b.waiting() == 5);
  // Rank 1 comes back with three slots: the serve hands the first over, then the room for the second hand-over
  // cannot be allocated.
  fail_handoff_room_after(1);
  b.set_flag(1, rank_flag::draining, false);
  fail_handoff_room_after(-1);
  REQUIRE(w.delivered.size() == 1);
  CHECK(w.rank_of(0) == 1u);
  CHECK(b.inflight(1) == 1);  // no lease made for a waiter left in line
  CHECK(b.waiting() == 4);
  CHECK(b.waiting_of(0) == 2);
  CHECK(b.waiting_of(2) == 2);
  // The next event serves the others, in their order.
  b.reconsider();
  REQUIRE(w.delivered.size() == 3);
  CHECK(w.delivered[1].first == 1);
  CHECK(w.delivered[2].first == 2);
  CHECK(b.inflight(1) == 3);
  CHECK(b.waiting() == 2);
  held.clear();
  REQUIRE(w.delivered.size() == 5);
  CHECK(b.waiting() == 0);
  CHECK(b.queue_bands() == 0);
  w.delivered.clear();
  CHECK(b.inflight(0) == 0);
  CHECK(b.inflight(1) == 0);
}
