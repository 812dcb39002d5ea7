// Clusters in the balancer: each cluster's ranks take only its requests, under its own policy and
// rotation, a burst into each is exact, and one cluster's full queue never holds another's waiters back.

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "fifo_wait.hpp"
#include "picks_per_rank.hpp"

using namespace dplb::balancer;
using dplb::balancer::test::picks_per_rank;
using dplb::balancer::test::acquire_or_wait_fifo;

namespace {

std::vector<std::unique_ptr<policy>> policies(std::initializer_list<const char*> names) {
  std::vector<std::unique_ptr<policy>> out;
  for (const char* name : names) out.push_back(make_policy(name));
  return out;
}

pick_context in_cluster(std::size_t cluster) {
  pick_context request;
  request.cluster = cluster;
  return request;
}

}  // namespace

TEST_CASE("each cluster's requests go to its ranks only, and a burst into each is exact", "[balancer][clusters]") {
  // Ranks 0-1 and 4 serve cluster 0 (least-inflight); ranks 2-3 cluster 1 (round-robin).
  const std::size_t clusters[] = {0, 0, 1, 1, 0};
  balancer b(clusters, policies({"least-inflight", "round-robin"}));
  CHECK(b.cluster_count() == 2);
  CHECK(b.policy_of(1).name() == "round-robin");
  std::vector<rank_lease> held;
  for (int i = 0; i < 30; ++i) held.push_back(b.acquire(in_cluster(0)));
  for (int i = 0; i < 8; ++i) held.push_back(b.acquire(in_cluster(1)));
  CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{10, 10, 4, 4, 10});
  // No cluster 2: nothing.
  CHECK_FALSE(b.acquire(in_cluster(2)));
  // Skew is per cluster: 10/10/10 and 4/4 are both even.
  CHECK(b.inflight_skew() == 0);
  held.pop_back();  // a cluster-1 request ends: 4/3 there
  CHECK(b.inflight_skew() == 1);
}

TEST_CASE("a cluster without a usable rank refuses, whatever the others have", "[balancer][clusters]") {
  const std::size_t clusters[] = {0, 1};
  balancer b(clusters, policies({"least-inflight", "least-inflight"}));
  b.set_flag(1, rank_flag::draining, true);
  CHECK_FALSE(b.acquire(in_cluster(1)));
  // So a refused request of cluster 1 is told "no usable rank" (503), not "queue full" (429).
  CHECK_FALSE(b.any_usable(1));
  CHECK(b.any_usable(0));
  CHECK(b.any_usable());
  CHECK_FALSE(b.engine_stats_of(7).ever);  // a rank not (yet) in the balancer
  const auto lease = b.acquire(in_cluster(0));
  REQUIRE(lease);
  CHECK(lease.rank() == 0);
}

TEST_CASE("one cluster's waiters never hold back another's, and each gets only its own ranks' slots",
          "[balancer][clusters]") {
  const std::size_t clusters[] = {0, 1};
  balancer b(clusters, policies({"least-inflight", "least-inflight"}), queue_limits{1, 16});
  auto busy0 = b.acquire(in_cluster(0));
  auto busy1 = b.acquire(in_cluster(1));
  REQUIRE(busy0);
  REQUIRE(busy1);
  std::vector<rank_lease> got0, got1;
  std::uint64_t id = 0;
  bool queued = false;
  // Cluster 0's waiter queues first, then cluster 1's.
  CHECK_FALSE(acquire_or_wait_fifo(b, in_cluster(0), {}, [&](rank_lease l) { got0.push_back(std::move(l)); }, id, queued));
  REQUIRE(queued);
  CHECK_FALSE(acquire_or_wait_fifo(b, in_cluster(1), {}, [&](rank_lease l) { got1.push_back(std::move(l)); }, id, queued));
  REQUIRE(queued);
  // Cluster 1's slot frees: its waiter gets it although cluster 0's waiter is older.
  busy1.release();
  REQUIRE(got1.size() == 1);
  CHECK(got1.front().rank() == 1);
  CHECK(got0.empty());
  busy0.release();
  REQUIRE(got0.size() == 1);
  CHECK(got0.front().rank() == 0);
  CHECK(b.waiting() == 0);
}

TEST_CASE("ranks added to a cluster at runtime serve that cluster only", "[balancer][clusters][growth]") {
  const std::size_t clusters[] = {0, 1};
  balancer b(clusters, policies({"round-robin", "round-robin"}), {}, {}, 8);
  const std::uint32_t weights[] = {1, 1};
  b.add_ranks(weights, 1);
  CHECK(b.cluster_of(3) == 1);
  std::vector<rank_lease> held;
  for (int i = 0; i < 6; ++i) held.push_back(b.acquire(in_cluster(1)));
  CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{0, 2, 2, 2});
  CHECK_THROWS_AS(b.add_ranks(weights, 2), std::out_of_range);
}

TEST_CASE("waiters that a removal strands are turned away at once, the others keep waiting", "[balancer][clusters]") {
  const std::size_t clusters[] = {0, 0, 1};
  balancer b(clusters, policies({"least-inflight", "least-inflight"}), queue_limits{1, 16});
  std::vector<rank_lease> busy;
  for (std::size_t c : {0, 0, 1}) busy.push_back(b.acquire(in_cluster(c)));
  std::vector<rank_lease> pinned_got, group0_got, group1_got;
  std::uint64_t id = 0;
  bool queued = false;
  pick_context pinned_to_1;
  pinned_to_1.pinned_rank = 1;
  acquire_or_wait_fifo(b, pinned_to_1, {}, [&](rank_lease l) { pinned_got.push_back(std::move(l)); }, id, queued);
  REQUIRE(queued);
  acquire_or_wait_fifo(b, in_cluster(0), {}, [&](rank_lease l) { group0_got.push_back(std::move(l)); }, id, queued);
  REQUIRE(queued);
  acquire_or_wait_fifo(b, in_cluster(1), {}, [&](rank_lease l) { group1_got.push_back(std::move(l)); }, id, queued);
  REQUIRE(queued);
  CHECK(b.waiting() == 3);

  // Rank 1 removed: its pinned waiter is turned away (an empty lease); group 0 still has rank 0, so its waiter stays.
  b.set_flag(1, rank_flag::removed, true);
  REQUIRE(pinned_got.size() == 1);
  CHECK_FALSE(pinned_got.front());
  CHECK(group0_got.empty());
  // Rank 2, group 1's only rank, removed: its group's waiter is turned away too.
  b.set_flag(2, rank_flag::removed, true);
  REQUIRE(group1_got.size() == 1);
  CHECK_FALSE(group1_got.front());
  CHECK(b.waiting() == 1);
  // A drain, which ends, strands nobody.
  b.set_flag(0, rank_flag::draining, true);
  CHECK(group0_got.empty());
  b.set_flag(0, rank_flag::draining, false);
  busy.front().release();
  REQUIRE(group0_got.size() == 1);
  CHECK(group0_got.front().rank() == 0);
}
