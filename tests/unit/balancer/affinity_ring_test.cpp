// Session affinity's ring: a key always lands on the same rank, keys spread over the ranks, a rank that
// joins takes only keys from the others (about its share, never moving keys between old ranks), and the
// walk skips ranks over the bound or unusable.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "dplb/balancer/affinity_ring.hpp"
#include "dplb/balancer/routing_stats.hpp"

using namespace dplb::balancer;

namespace {

std::vector<std::size_t> place_all(const affinity_ring& ring, const std::vector<rank_view>& ranks, int keys) {
  std::vector<std::size_t> out;
  for (int k = 0; k < keys; ++k) {
    const auto placed = ring.place("session-" + std::to_string(k), ranks, [](const rank_view&) { return true; });
    REQUIRE(placed);
    out.push_back(placed->rank);
  }
  return out;
}

}  // namespace

TEST_CASE("affinity ring: same key, same rank, and keys spread over the ranks", "[affinity]") {
  affinity_ring ring;
  ring.add_ranks(0, 4);
  const std::vector<rank_view> ranks(4);
  const auto first = place_all(ring, ranks, 4000);
  CHECK(place_all(ring, ranks, 4000) == first);
  std::map<std::size_t, int> per_rank;
  for (const auto r : first) ++per_rank[r];
  REQUIRE(per_rank.size() == 4);
  for (const auto& [rank, n] : per_rank) {
    INFO("rank " << rank);
    CHECK(n > 4000 / 4 * 0.8);  // 128 points a rank: shares within about 20% of even
    CHECK(n < 4000 / 4 * 1.2);
  }
}

TEST_CASE("affinity ring: a rank that joins takes about its share, all from the others, and nothing else moves",
          "[affinity]") {
  affinity_ring ring;
  ring.add_ranks(0, 4);
  const auto before = place_all(ring, std::vector<rank_view>(4), 4000);
  ring.add_ranks(4, 1);
  const auto after = place_all(ring, std::vector<rank_view>(5), 4000);
  int moved = 0;
  for (std::size_t k = 0; k < before.size(); ++k) {
    if (before[k] == after[k]) continue;
    ++moved;
    CHECK(after[k] == 4u);  // a key that moves goes to the new rank only
  }
  CHECK(moved > 4000 / 5 * 0.7);
  CHECK(moved < 4000 / 5 * 1.3);
}

TEST_CASE("affinity ring: an unusable rank or one over the bound is skipped, and the walk says so", "[affinity]") {
  affinity_ring ring;
  ring.add_ranks(0, 4);
  std::vector<rank_view> ranks(4);
  const auto home = ring.place("k", ranks, [](const rank_view&) { return true; });
  REQUIRE(home);
  CHECK_FALSE(home->moved);
  ranks[home->rank].usable = false;  // drained, unhealthy, another cluster: not even a candidate
  const auto elsewhere = ring.place("k", ranks, [](const rank_view&) { return true; });
  REQUIRE(elsewhere);
  CHECK(elsewhere->rank != home->rank);
  CHECK_FALSE(elsewhere->moved);
  ranks[home->rank].usable = true;
  ranks[home->rank].inflight = 10;  // over the bound
  const load_bound bound(ranks, 1.25);
  const auto moved = ring.place("k", ranks, [&](const rank_view& h) { return bound.allows(h); });
  REQUIRE(moved);
  CHECK(moved->rank != home->rank);
  CHECK(moved->moved);
  for (auto& h : ranks) h.usable = false;
  CHECK_FALSE(ring.place("k", ranks, [](const rank_view&) { return true; }));
}
