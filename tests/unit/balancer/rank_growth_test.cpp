// Ranks added while dplb runs (the admin API, SIGHUP): usable at once, counted exactly while other
// threads pick, ramped up like a readmitted rank, and bounded by the capacity made at start-up.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "fifo_wait.hpp"
#include "picks_per_rank.hpp"

using namespace dplb::balancer;
using dplb::balancer::test::picks_per_rank;
using dplb::balancer::test::acquire_or_wait_fifo;

TEST_CASE("added ranks join the rotation at once, and a burst after the addition is exact", "[balancer][growth]") {
  for (const char* policy : {"least-inflight", "least-load", "least-tokens"}) {
    INFO(policy);
    balancer b(2, make_policy(policy), {}, {}, 8);
    std::vector<rank_lease> held;
    for (int i = 0; i < 4; ++i) held.push_back(b.acquire());
    const std::uint32_t weights[] = {1, 1};
    b.add_ranks(weights);
    REQUIRE(b.rank_count() == 4);
    CHECK(b.usable(3));
    // The two old ranks hold 2 each; a burst of 8 fills the new ones first, then all four evenly.
    for (int i = 0; i < 8; ++i) held.push_back(b.acquire());
    for (std::size_t r = 0; r < 4; ++r) CHECK(b.inflight(r) == 3);
  }
  // Round-robin counts turns, not loads: the new ranks take theirs from the next pick on.
  balancer b(2, make_policy("round-robin"), {}, {}, 8);
  std::vector<rank_lease> held;
  for (int i = 0; i < 4; ++i) held.push_back(b.acquire());
  const std::uint32_t weights[] = {1, 1};
  b.add_ranks(weights);
  for (int i = 0; i < 8; ++i) held.push_back(b.acquire());
  CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{4, 4, 2, 2});
}

TEST_CASE("ranks added while other threads pick are counted exactly and never lost", "[balancer][growth]") {
  balancer b(2, make_policy("least-inflight"), {}, {}, 64);
  std::atomic<bool> adding_done{false};
  std::atomic<std::uint64_t> picked{0};
  std::atomic<std::uint64_t> bad_picks{0};  // no lease, or a rank not yet published (Catch2 asserts on one thread only)
  std::vector<std::thread> pickers;
  for (int t = 0; t < 3; ++t) {
    pickers.emplace_back([&] {
      // Until the last rank is in, and then a bit more: picks race every addition.
      for (int extra = 0; extra < 200;) {
        auto lease = b.acquire();
        if (!lease || lease.rank() >= b.rank_count()) bad_picks.fetch_add(1, std::memory_order_relaxed);
        if (lease) picked.fetch_add(1, std::memory_order_relaxed);
        if (adding_done.load()) ++extra;
      }
    });
  }
  const std::uint32_t one[] = {1};
  for (int i = 0; i < 30; ++i) b.add_ranks(one);
  adding_done = true;
  for (auto& t : pickers) t.join();
  CHECK(bad_picks.load() == 0);
  const auto picks = picks_per_rank(b);
  REQUIRE(picks.size() == 32);
  CHECK(std::accumulate(picks.begin(), picks.end(), std::uint64_t{0}) == picked.load());
  // The ranks added last took their share of the picks after them.
  CHECK(std::accumulate(picks.begin() + 2, picks.end(), std::uint64_t{0}) > 0);
  CHECK(picks.back() > 0);
  for (std::size_t r = 0; r < 32; ++r) CHECK(b.inflight(r) == 0);
}

TEST_CASE("a rank added with slow start on ramps up, and beyond the capacity nothing is added", "[balancer][growth]") {
  balancer b(1, make_policy("round-robin"), {}, rank_timing{std::chrono::hours(1), std::chrono::seconds(1)}, 2);
  const std::uint32_t weight[] = {1};
  b.add_ranks(weight);
  // At a tenth of its weight for the hour of its ramp: about one pick in eleven.
  std::vector<rank_lease> held;
  for (int i = 0; i < 110; ++i) held.push_back(b.acquire());
  CHECK(b.inflight(1) >= 9);
  CHECK(b.inflight(1) <= 11);
  CHECK_THROWS_AS(b.add_ranks(weight), std::length_error);
  CHECK(b.rank_count() == 2);
}

TEST_CASE("queued requests take the slots of a rank added while they wait", "[balancer][growth]") {
  balancer b(1, make_policy("least-inflight"), queue_limits{1, 8}, {}, 4);
  auto first = b.acquire();
  REQUIRE(first);
  std::vector<rank_lease> delivered;
  std::uint64_t id = 0;
  bool queued = false;
  CHECK_FALSE(acquire_or_wait_fifo(b, {}, {}, [&](rank_lease l) { delivered.push_back(std::move(l)); }, id, queued));
  REQUIRE(queued);
  const std::uint32_t weight[] = {1};
  b.add_ranks(weight);
  REQUIRE(delivered.size() == 1);
  CHECK(delivered.front().rank() == 1);
  CHECK(b.waiting() == 0);
}
