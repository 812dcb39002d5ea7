// One queue per cluster: each cluster's queue keeps its own fair order (a virtual clock per priority band), so
// what a tenant does in one cluster (a P/D deployment's decode pool) does not move its place, or anyone's, in
// another (the prefill pool).
#include <catch2/catch.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "served_log.hpp"

using namespace dplb::balancer;
using dplb::balancer::test::in_cluster;
using dplb::balancer::test::served_log;

namespace {

constexpr std::size_t prefill = 0;
constexpr std::size_t decode = 1;

queue_share of_tenant(std::uint64_t tenant) {
  queue_share share;
  share.tenant = tenant;
  return share;
}

// Rank 0 is the prefill pool, rank 1 the decode pool, one slot each.
balancer prefill_and_decode() {
  const std::size_t clusters[] = {prefill, decode};
  std::vector<std::unique_ptr<policy>> policies;
  policies.push_back(make_policy("least-inflight"));
  policies.push_back(make_policy("least-inflight"));
  return balancer(clusters, std::move(policies), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 256});
}

}  // namespace

TEST_CASE("a tenant's backlog in the decode pool puts no one behind it in the prefill pool",
          "[balancer][queue][fair][clusters]") {
  auto b = prefill_and_decode();
  served_log prefill_log(b);  // each pool's waiters as they are served, and the slots they hold
  served_log decode_log(b);
  prefill_log.take(b.acquire(in_cluster(prefill)));
  decode_log.take(b.acquire(in_cluster(decode)));
  constexpr std::uint64_t heavy = 1;
  constexpr std::uint64_t light = 2;
  // The heavy tenant has four prompts waiting for the prefill pool, then floods the decode pool.
  for (int i = 0; i < 4; ++i) prefill_log.queue("heavy", of_tenant(heavy), in_cluster(prefill));
  for (int i = 0; i < 40; ++i) decode_log.queue("decode", of_tenant(heavy), in_cluster(decode));
  // The decode pool works through half its flood: the decode queue's clock moves, the prefill queue's does not.
  for (int i = 0; i < 20; ++i) decode_log.release_one();
  REQUIRE(decode_log.order.size() == 20);
  // A light tenant's first prompt starts where the prefill queue's clock is: one turn after the heavy
  // tenant's first (which came first), not after all four of its prefill backlog.
  prefill_log.queue("light", of_tenant(light), in_cluster(prefill));
  for (int i = 0; i < 5; ++i) prefill_log.release_one();
  CHECK(prefill_log.order == std::vector<std::string>{"heavy", "light", "heavy", "heavy", "heavy"});
  CHECK(b.waiting() == 20);
  CHECK(b.waiting_of(heavy) == 20);
  CHECK(b.waiting_of(light) == 0);
}

TEST_CASE("a tenant's max_queued counts its waiters over every cluster", "[balancer][queue][fair][clusters]") {
  auto b = prefill_and_decode();
  served_log log(b);
  log.take(b.acquire(in_cluster(prefill)));
  log.take(b.acquire(in_cluster(decode)));
  auto share = of_tenant(7);
  share.max_queued = 3;
  const auto queue = [&](std::size_t cluster) { return b.acquire_or_wait(in_cluster(cluster), {}, share, [](rank_lease) {}).state; };
  CHECK(queue(prefill) == wait_state::queued);
  CHECK(queue(decode) == wait_state::queued);
  CHECK(queue(decode) == wait_state::queued);
  CHECK(queue(prefill) == wait_state::tenant_queue_full);
  CHECK(queue(decode) == wait_state::tenant_queue_full);
  CHECK(b.waiting_of(7) == 3);
}
