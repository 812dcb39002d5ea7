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

using namespace dplb::balancer;

namespace {

constexpr std::size_t prefill = 0;
constexpr std::size_t decode = 1;

queue_share of_tenant(std::uint64_t tenant) {
  queue_share share;
  share.tenant = tenant;
  return share;
}

pick_context in_cluster(std::size_t cluster) {
  pick_context request;
  request.cluster = cluster;
  return request;
}

// Rank 0 is the prefill pool, rank 1 the decode pool, one slot each.
balancer prefill_and_decode() {
  const std::size_t clusters[] = {prefill, decode};
  std::vector<std::unique_ptr<policy>> policies;
  policies.push_back(make_policy("least-inflight"));
  policies.push_back(make_policy("least-inflight"));
  return balancer(clusters, std::move(policies), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 256});
}

// Each cluster's waiters as they are served, and the slots they hold (the oldest is released next).
struct pool_log {
  explicit pool_log(balancer& owner) : b(owner) {}
  ~pool_log() { b.close(); }
  pool_log(const pool_log&) = delete;
  pool_log& operator=(const pool_log&) = delete;
  balancer& b;
  std::vector<std::string> served[2];
  std::deque<rank_lease> held[2];

  void queue(std::size_t cluster, std::uint64_t tenant, const std::string& label) {
    auto out = b.acquire_or_wait(in_cluster(cluster), {}, of_tenant(tenant), [this, cluster, label](rank_lease lease) {
      served[cluster].push_back(label);
      held[cluster].push_back(std::move(lease));
    });
    REQUIRE(out.state == wait_state::queued);
  }
  void release_one(std::size_t cluster) {
    REQUIRE_FALSE(held[cluster].empty());
    auto lease = std::move(held[cluster].front());
    held[cluster].pop_front();
    lease.release();
  }
};

}  // namespace

TEST_CASE("a tenant's backlog in the decode pool puts no one behind it in the prefill pool",
          "[balancer][queue][fair][clusters]") {
  auto b = prefill_and_decode();
  pool_log log(b);
  log.held[prefill].push_back(b.acquire(in_cluster(prefill)));
  log.held[decode].push_back(b.acquire(in_cluster(decode)));
  REQUIRE(log.held[prefill].back());
  REQUIRE(log.held[decode].back());
  constexpr std::uint64_t heavy = 1;
  constexpr std::uint64_t light = 2;
  // The heavy tenant has four prompts waiting for the prefill pool, then floods the decode pool.
  for (int i = 0; i < 4; ++i) log.queue(prefill, heavy, "heavy");
  for (int i = 0; i < 40; ++i) log.queue(decode, heavy, "decode");
  // The decode pool works through half its flood: the decode queue's clock moves, the prefill queue's does not.
  for (int i = 0; i < 20; ++i) log.release_one(decode);
  REQUIRE(log.served[decode].size() == 20);
  // A light tenant's first prompt starts where the prefill queue's clock is: one turn after the heavy
  // tenant's first (which came first), not after all four of its prefill backlog.
  log.queue(prefill, light, "light");
  for (int i = 0; i < 5; ++i) log.release_one(prefill);
  CHECK(log.served[prefill] == std::vector<std::string>{"heavy", "light", "heavy", "heavy", "heavy"});
  CHECK(b.waiting() == 20);
  CHECK(b.waiting_of(heavy) == 20);
  CHECK(b.waiting_of(light) == 0);
}

TEST_CASE("a tenant's max_queued counts its waiters over every cluster", "[balancer][queue][fair][clusters]") {
  auto b = prefill_and_decode();
  pool_log log(b);
  log.held[prefill].push_back(b.acquire(in_cluster(prefill)));
  log.held[decode].push_back(b.acquire(in_cluster(decode)));
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
