// The baselines that bench/imbalance.sh measures dplb against. They must behave as the balancers they
// stand for, flaws included, or the benchmark proves nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/engine_stats.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/balancer/random_pick.hpp"

using dplb::balancer::balancer;
using dplb::balancer::engine_load;
using dplb::balancer::engine_stats;
using dplb::balancer::random_pick;
using dplb::balancer::rank_view;

namespace {

std::vector<std::size_t> picks_of(dplb::balancer::policy& p, std::vector<rank_view> ranks, int times) {
  std::vector<std::size_t> out;
  for (int i = 0; i < times; ++i) out.push_back(p.choose({}, ranks).value());
  return out;
}

}  // namespace

TEST_CASE("random picks every usable rank about equally and never an unusable one", "[balancer][baseline]") {
  random_pick p(20261202);
  std::vector<rank_view> ranks(5);
  ranks[2].usable = false;
  std::vector<int> counts(5, 0);
  int repeats = 0;
  std::size_t previous = 99;
  for (int i = 0; i < 40'000; ++i) {
    const auto r = p.choose({}, ranks).value();
    ++counts[r];
    repeats += r == previous;
    previous = r;
  }
  CHECK(counts[2] == 0);
  for (const int r : {0, 1, 3, 4}) CHECK((counts[r] > 9'400 && counts[r] < 10'600));  // 10,000 +- 6%
  // Unlike a rotation, the same rank comes twice in a row about a quarter of the time.
  CHECK((repeats > 9'000 && repeats < 11'000));
  for (auto& r : ranks) r.usable = false;
  CHECK_FALSE(p.choose({}, ranks).has_value());
}

TEST_CASE("engine-stats picks the lowest 4*waiting+running and counts its picks as waiting", "[balancer][baseline]") {
  engine_stats p;
  const std::vector<engine_load> snapshot{{.waiting = 0, .running = 5},
                                          {.waiting = 1, .running = 0},
                                          {.waiting = 2, .running = 0},
                                          {.waiting = 0, .running = 3}};
  p.on_engine_stats(snapshot);
  // Scores 5, 4, 8, 3. Rank 3 (3 -> 7), then rank 1 (4 -> 8), rank 0 (5 -> 9), rank 3 (7 -> 11), then the
  // tie at 8 between ranks 1 and 2 goes to the lower index, as vLLM's client scans.
  CHECK(picks_of(p, std::vector<rank_view>(4), 6) == std::vector<std::size_t>{3, 1, 0, 3, 1, 2});
}

TEST_CASE("engine-stats forgets its own picks at each snapshot, which is what unbalances a burst",
          "[balancer][baseline]") {
  engine_stats p;
  const std::vector<rank_view> ranks(4);
  // Before any snapshot the local counts alone spread the picks.
  CHECK(picks_of(p, ranks, 4) == std::vector<std::size_t>{0, 1, 2, 3});
  CHECK(picks_of(p, ranks, 2) == std::vector<std::size_t>{0, 1});
  // A snapshot taken before the engines saw any of those six requests says every rank is idle: the
  // picks start over at rank 0, and ranks 0 and 1 end up with one request more than 2 and 3.
  p.on_engine_stats(std::vector<engine_load>(4));
  CHECK(picks_of(p, ranks, 2) == std::vector<std::size_t>{0, 1});
}

TEST_CASE("engine-stats skips unusable ranks however low their score", "[balancer][baseline]") {
  engine_stats p;
  p.on_engine_stats(std::vector<engine_load>{{.waiting = 0, .running = 0}, {.waiting = 9, .running = 9}});
  std::vector<rank_view> ranks(2);
  ranks[0].usable = false;
  CHECK(picks_of(p, ranks, 3) == std::vector<std::size_t>{1, 1, 1});
  ranks[1].usable = false;
  CHECK_FALSE(p.choose({}, ranks).has_value());
}

TEST_CASE("the balancer hands published engine stats to its policy and keeps its own counts", "[balancer][baseline]") {
  balancer b(3, std::make_unique<engine_stats>());
  CHECK(b.active_policy().uses_engine_stats());
  std::vector<dplb::balancer::engine_reading> round(3);
  const std::vector<engine_load> loads{{.waiting = 3, .running = 0}, {.waiting = 0, .running = 1}, {.waiting = 2, .running = 0}};
  for (std::size_t r = 0; r < 3; ++r) round[r] = {.good = true, .load = loads[r], .read_at = std::chrono::steady_clock::now()};
  b.publish_engine_stats(round);
  auto lease = b.acquire();
  CHECK(lease.rank() == 1);  // score 1 against 12 and 8
  // The engines' numbers steer the pick but never replace what dplb knows it has in flight.
  CHECK(b.inflight(0) == 0);
  CHECK(b.inflight(1) == 1);
  CHECK(b.inflight(2) == 0);
}

TEST_CASE("only the engine-stats baseline and least-load ask for engine stats, least-tokens and prefix-aware for the body", "[balancer][baseline]") {
  for (const auto name : dplb::support::policy_names) {
    INFO(name);
    CHECK(dplb::balancer::make_policy(name)->uses_engine_stats() == (name == "engine-stats" || name == "least-load"));
    CHECK(dplb::balancer::make_policy(name)->needs_request_facts() == (name == "least-tokens" || name == "prefix-aware"));
  }
}
