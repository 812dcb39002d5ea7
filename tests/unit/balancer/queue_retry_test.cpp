// A retry in dplb's queue (queue_share::retry): a request whose rank failed before taking it waits, when
// every rank it has not tried is full, for a slot on one of those, before every other waiter; a slot freed on
// a rank it tried goes to the next waiter; once no untried rank is usable it is turned away.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/least_inflight.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/balancer/prefix_index.hpp"
#include "prefix_groups.hpp"
#include "recorded_waiters.hpp"

using namespace dplb::balancer;
using dplb::balancer::test::group_chain;
using dplb::balancer::test::recorded_waiters;
using dplb::balancer::test::with_chain;

namespace {

balancer three_ranks_of_one() {
  return balancer(3, std::make_unique<least_inflight>(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 2});
}


// Every rank's one slot, held.
std::vector<rank_lease> fill(balancer& b) {
  std::vector<rank_lease> held;
  for (std::size_t r = 0; r < b.rank_count(); ++r) held.push_back(b.acquire());
  return held;
}

// A retry's pick: the ranks it tried are `tried`, which must outlive it.
pick_context retry_after(const std::vector<bool>& tried) {
  pick_context retry;
  retry.avoid = &tried;
  return retry;
}

queue_share retry_share() {
  queue_share s;
  s.retry = true;
  return s;
}

}  // namespace

TEST_CASE("a retry waits for a rank it has not tried, ahead of the queue, and passes over the one it tried",
          "[balancer][queue][retry]") {
  auto b = three_ranks_of_one();
  auto held = fill(b);
  recorded_waiters w(b);
  REQUIRE(w.queue({}).state == wait_state::queued);  // waiter 0: an ordinary request, first in line
  REQUIRE(w.queue({}).state == wait_state::queued);  // waiter 1: the queue is now full (max_waiting 2)
  // The retry tried rank 0; a full queue does not refuse it.
  const std::vector<bool> tried{true, false, false};
  const auto retry = retry_after(tried);
  REQUIRE(w.queue(retry, retry_share()).state == wait_state::queued);  // waiter 2
  CHECK(b.waiting() == 3);
  // Rank 0 frees: the retry passes it over, the oldest ordinary waiter takes it.
  held[0].release();
  CHECK(w.rank_of(0) == 0u);
  CHECK_FALSE(w.rank_of(2));
  // Rank 2 frees: the retry goes first, though it came last.
  held[2].release();
  CHECK(w.rank_of(2) == 2u);
  CHECK_FALSE(w.rank_of(1));
  CHECK(b.waiting() == 1);
}

TEST_CASE("a retry with no untried rank left is turned away, in the queue or before it", "[balancer][queue][retry]") {
  auto b = three_ranks_of_one();
  auto held = fill(b);
  recorded_waiters w(b);
  const std::vector<bool> tried{true, true, false};
  const auto retry = retry_after(tried);
  SECTION("its last untried rank goes down while it waits") {
    REQUIRE(w.queue(retry, retry_share()).state == wait_state::queued);
    held[0].release();  // a slot on a rank it tried: not for it
    CHECK(w.delivered.empty());
    b.set_flag(2, rank_flag::unhealthy, true);
    CHECK(w.turned_away(0));
    CHECK(b.waiting() == 0);
  }
  SECTION("no untried rank is usable when it comes") {
    b.set_flag(2, rank_flag::unhealthy, true);
    CHECK(w.queue(retry, retry_share()).state == wait_state::no_usable_rank);
    CHECK(b.waiting() == 0);
  }
}

TEST_CASE("a request arriving while a retry passes over the room takes that room at once", "[balancer][queue][retry]") {
  auto b = three_ranks_of_one();  // --long-prompt-tokens off: retries alone set waiters aside
  auto held = fill(b);
  recorded_waiters w(b);
  const std::vector<bool> tried{true, false, false};
  const auto retry = retry_after(tried);
  REQUIRE(w.queue(retry, retry_share()).state == wait_state::queued);
  held[0].release();  // the retry passes it over: rank 0 is idle with a waiter in line
  CHECK(b.inflight(0) == 0);
  const auto newcomer = w.queue({});
  // It may not take the slot at once past a waiter in its line, but the same call serves it: no idle rank
  // beside a waiter it suits.
  CHECK(newcomer.state == wait_state::queued);
  CHECK(w.rank_of(1) == 0u);
  CHECK(b.inflight(0) == 1);
  CHECK(b.waiting() == 1);
}

TEST_CASE("a retry takes the first slot of an untried rank, whatever its policy would prefer",
          "[balancer][queue][retry][prefix]") {
  balancer b(3, std::make_unique<prefix_aware>(prefix_aware_options{}, nullptr),
             queue_limits{.max_inflight_per_rank = 1, .max_waiting = 8});
  const auto a = group_chain('a');
  const auto x = group_chain('x');
  const auto y = group_chain('y');
  auto on_a = b.acquire(with_chain(a));
  auto on_x = b.acquire(with_chain(x));
  auto on_y = b.acquire(with_chain(y));
  REQUIRE(on_a.rank() == 0);
  REQUIRE(on_x.rank() == 1);
  REQUIRE(on_y.rank() == 2);
  recorded_waiters w(b);
  // Group x's prompt, retried after rank 0 failed: its prefix is on rank 1 (full), but it had its turn and
  // must not hold out for that rank.
  std::vector<bool> tried{true, false, false};
  auto retry = with_chain(x);
  retry.avoid = &tried;
  REQUIRE(w.queue(retry, retry_share()).state == wait_state::queued);
  on_y.release();
  CHECK(w.rank_of(0) == 2u);
  CHECK(b.waiting() == 0);
}

TEST_CASE("a request refused a place in a full queue still takes the room a retry passes over",
          "[balancer][queue][retry]") {
  balancer b(3, std::make_unique<least_inflight>(), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 1});
  auto held = fill(b);
  recorded_waiters w(b);
  const std::vector<bool> tried{true, false, false};
  const auto retry = retry_after(tried);
  REQUIRE(w.queue(retry, retry_share()).state == wait_state::queued);  // no queue limit refuses a retry
  held[0].release();  // passed over by the retry: idle
  // The queue is full (one waiter), so the newcomer may not wait; rank 0 is idle and nobody waiting can
  // use it: a slot beats a 429.
  auto out = w.queue({});
  CHECK(out.state == wait_state::served);
  REQUIRE(out.lease);
  CHECK(out.lease.rank() == 0);
  CHECK(b.waiting() == 1);
}
