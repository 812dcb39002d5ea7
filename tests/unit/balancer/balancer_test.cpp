#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "fifo_wait.hpp"
#include "picks_per_rank.hpp"

using dplb::balancer::balancer;
using dplb::balancer::make_policy;
using dplb::balancer::rank_lease;
using dplb::balancer::test::picks_per_rank;
using dplb::balancer::test::acquire_or_wait_fifo;

namespace {

std::size_t spread(const std::vector<std::size_t>& v) {
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

}  // namespace

TEST_CASE("a burst of K*m requests lands exactly m on each rank", "[balancer]") {
  const auto policy_name = GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens");
  const std::size_t ranks = GENERATE(1u, 3u, 4u, 8u);
  const std::size_t per_rank = 64;
  balancer b(ranks, make_policy(policy_name));
  std::vector<rank_lease> held;  // a burst: nothing finishes before every request was placed
  for (std::size_t i = 0; i < ranks * per_rank; ++i) held.push_back(b.acquire());
  INFO(policy_name << " over " << ranks << " ranks");
  CHECK(picks_per_rank(b) == std::vector<std::size_t>(ranks, per_rank));
  for (std::size_t r = 0; r < ranks; ++r) CHECK(b.inflight(r) == per_rank);
  held.clear();
  for (std::size_t r = 0; r < ranks; ++r) CHECK(b.inflight(r) == 0);
}

TEST_CASE("a burst that does not divide evenly differs by at most one", "[balancer]") {
  const auto policy_name = GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens");
  const std::size_t burst = GENERATE(250u, 255u, 257u, 1023u);
  balancer b(4, make_policy(policy_name));
  std::vector<rank_lease> held;
  for (std::size_t i = 0; i < burst; ++i) held.push_back(b.acquire());
  const auto counts = picks_per_rank(b);
  CHECK(spread(counts) <= 1);
  CHECK(counts[0] + counts[1] + counts[2] + counts[3] == burst);
}

TEST_CASE("least-inflight breaks ties in rotation after the last pick", "[balancer]") {
  balancer b(4, make_policy("least-inflight"));
  // Each request finishes before the next starts: every pick is a four-way tie.
  std::vector<std::size_t> order;
  for (int i = 0; i < 8; ++i) order.push_back(b.acquire().rank());
  CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 0, 1, 2, 3});
}

TEST_CASE("least-inflight prefers the least loaded rank over the rotation", "[balancer]") {
  balancer b(3, make_policy("least-inflight"));
  auto a = b.acquire();  // rank 0
  auto c = b.acquire();  // rank 1
  auto d = b.acquire();  // rank 2
  REQUIRE(a.rank() == 0);
  c.release();           // rank 1 now has the fewest
  CHECK(b.acquire().rank() == 1);
}

TEST_CASE("least-inflight keeps max-min in-flight <= 1 under random completion order", "[balancer]") {
  const auto seed = GENERATE(1u, 2u, 3u, 42u, 1234u);
  std::mt19937 rng(seed);
  balancer b(4, make_policy("least-inflight"));
  std::vector<rank_lease> live;
  // Uniform load: keep 100 requests in flight; each step one random request finishes and a new one
  // arrives. The skew must never exceed 1 at any instant after a pick.
  for (int i = 0; i < 100; ++i) live.push_back(b.acquire());
  std::uint32_t worst = b.inflight_skew();
  for (int step = 0; step < 20000; ++step) {
    std::uniform_int_distribution<std::size_t> pick(0, live.size() - 1);
    std::swap(live[pick(rng)], live.back());
    live.pop_back();
    live.push_back(b.acquire());
    worst = std::max(worst, b.inflight_skew());
  }
  INFO("seed " << seed);
  CHECK(worst <= 1);
}

TEST_CASE("round-robin ignores load and keeps strict rotation", "[balancer]") {
  balancer b(3, make_policy("round-robin"));
  auto held = b.acquire();  // rank 0 stays busy
  std::vector<std::size_t> order;
  for (int i = 0; i < 6; ++i) order.push_back(b.acquire().rank());
  CHECK(order == std::vector<std::size_t>{1, 2, 0, 1, 2, 0});
}

TEST_CASE("unusable ranks get no requests, and none usable gives an empty lease", "[balancer]") {
  const auto policy_name = GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens");
  balancer b(4, make_policy(policy_name));
  b.set_flag(1, dplb::balancer::rank_flag::unhealthy, true);
  std::vector<rank_lease> held;
  for (int i = 0; i < 300; ++i) held.push_back(b.acquire());
  CHECK(b.picks(1) == 0);
  CHECK(picks_per_rank(b) == std::vector<std::size_t>{100, 0, 100, 100});
  CHECK(b.inflight_skew() == 0);  // the unusable rank is not part of the skew
  for (std::size_t r = 0; r < 4; ++r) b.set_flag(r, dplb::balancer::rank_flag::unhealthy, true);
  CHECK_FALSE(b.any_usable());
  CHECK_FALSE(b.acquire());
}

TEST_CASE("a lease releases exactly once, also when moved", "[balancer]") {
  balancer b(2, make_policy("least-inflight"));
  rank_lease outer;
  {
    auto inner = b.acquire();
    CHECK(b.inflight(inner.rank()) == 1);
    outer = std::move(inner);
  }  // the moved-from lease must not release
  CHECK(b.inflight(outer.rank()) == 1);
  outer.release();
  outer.release();  // second release is a no-op, never negative
  CHECK(b.inflight(0) == 0);
  CHECK(b.inflight(1) == 0);
}

TEST_CASE("concurrent picks from several threads stay exact", "[balancer]") {
  const auto policy_name = GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens");
  constexpr std::size_t threads = 4, per_thread = 1024, ranks = 4;
  balancer b(ranks, make_policy(policy_name));
  std::vector<std::vector<rank_lease>> held(threads);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_thread; ++i) held[t].push_back(b.acquire());
    });
  }
  for (auto& th : pool) th.join();
  CHECK(picks_per_rank(b) == std::vector<std::size_t>(ranks, threads * per_thread / ranks));

  // Concurrent release and re-acquire: counts return to zero, never wrap.
  pool.clear();
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (auto& lease : held[t]) {
        lease.release();
        auto again = b.acquire();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (std::size_t r = 0; r < ranks; ++r) CHECK(b.inflight(r) == 0);
}

TEST_CASE("the factory knows every listed policy and nothing else", "[balancer]") {
  for (auto name : dplb::support::policy_names) {
    auto p = make_policy(name);
    REQUIRE(p);
    CHECK(p->name() == name);
  }
  CHECK(make_policy("fastest") == nullptr);
}

TEST_CASE("a retry never goes back to an excluded rank", "[balancer]") {
  const auto policy_name = GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens");
  balancer b(3, make_policy(policy_name));
  std::vector<bool> excluded{true, false, true};
  for (int i = 0; i < 10; ++i) CHECK(b.acquire({.avoid = &excluded}).rank() == 1);
  excluded[1] = true;
  CHECK_FALSE(b.acquire({.avoid = &excluded}));
  CHECK(b.acquire());  // the exclusion is per call only
}

TEST_CASE("a hand-over that throws gives its slot back and strands no other waiter", "[balancer][queue]") {
  balancer b(1, make_policy("least-inflight"), dplb::balancer::queue_limits{1, 4});
  auto held = b.acquire();
  REQUIRE(held);
  std::uint64_t ids[2] = {};
  bool queued = false;
  // The first waiter's hand-over fails after taking the lease (as a post that cannot allocate would).
  CHECK_FALSE(acquire_or_wait_fifo(b, {}, {}, [](rank_lease l) { throw std::bad_alloc(); }, ids[0], queued));
  REQUIRE(queued);
  std::vector<rank_lease> delivered;
  CHECK_FALSE(acquire_or_wait_fifo(b, {}, {}, [&](rank_lease l) { delivered.push_back(std::move(l)); }, ids[1], queued));
  REQUIRE(queued);
  held.release();  // the slot goes to the first waiter, whose hand-over throws and releases it: the second gets it
  REQUIRE(delivered.size() == 1);
  CHECK(delivered[0]);
  CHECK(b.inflight(0) == 1);
  CHECK(b.waiting() == 0);
  delivered.clear();
  CHECK(b.inflight(0) == 0);  // nothing leaked
}

TEST_CASE("with a per-rank limit, requests queue FIFO and each freed slot goes to the oldest", "[balancer][queue]") {
  balancer b(2, make_policy("least-inflight"), dplb::balancer::queue_limits{2, 3});
  std::vector<rank_lease> held;
  for (int i = 0; i < 4; ++i) held.push_back(b.acquire());
  CHECK(b.inflight(0) == 2);
  CHECK(b.inflight(1) == 2);
  CHECK_FALSE(b.acquire());  // full

  std::vector<std::pair<int, rank_lease>> delivered;
  std::uint64_t ids[4] = {};
  bool queued = false;
  for (int w = 0; w < 3; ++w) {
    auto now = acquire_or_wait_fifo(b, {}, {}, [&, w](rank_lease l) { delivered.emplace_back(w, std::move(l)); }, ids[w], queued);
    CHECK_FALSE(now);
    CHECK(queued);
  }
  CHECK(b.waiting() == 3);
  // The queue is bounded: a fourth waiter is refused at once.
  auto refused = acquire_or_wait_fifo(b, {}, {}, [](rank_lease) {}, ids[3], queued);
  CHECK_FALSE(refused);
  CHECK_FALSE(queued);

  CHECK(b.cancel_wait(ids[1]));  // the second waiter gives up
  CHECK_FALSE(b.cancel_wait(ids[1]));
  held[1].release();  // a slot on rank 1 frees: the oldest waiter (0) gets it
  REQUIRE(delivered.size() == 1);
  CHECK(delivered[0].first == 0);
  CHECK(delivered[0].second.rank() == 1);
  CHECK_FALSE(b.acquire());  // a new request does not jump the remaining waiter
  held[0].release();
  REQUIRE(delivered.size() == 2);
  CHECK(delivered[1].first == 2);
  CHECK(b.waiting() == 0);
  CHECK_FALSE(b.cancel_wait(ids[2]));  // already served
  CHECK(b.inflight(0) == 2);
  CHECK(b.inflight(1) == 2);
}

TEST_CASE("without a limit nothing ever queues", "[balancer][queue]") {
  balancer b(2, make_policy("round-robin"));
  std::uint64_t id = 0;
  bool queued = true;
  for (int i = 0; i < 100; ++i) CHECK(acquire_or_wait_fifo(b, {}, {}, [](rank_lease) {}, id, queued));
  b.set_flag(0, dplb::balancer::rank_flag::unhealthy, true);
  b.set_flag(1, dplb::balancer::rank_flag::unhealthy, true);
  CHECK_FALSE(acquire_or_wait_fifo(b, {}, {}, [](rank_lease) {}, id, queued));
  CHECK_FALSE(queued);  // no usable rank: refused, not queued
}
