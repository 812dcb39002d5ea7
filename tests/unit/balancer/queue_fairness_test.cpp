// The queue's order (queue_share, fair_order.hpp): the lowest priority value first; among equal priorities,
// tenants share the freed slots in proportion to their weights, each request counting its cost (start-time
// fair queueing); one tenant's requests in their order of arrival. A tenant queues at most max_queued
// requests, and the order's state lasts only as long as its waiters.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/balancer/prefix_index.hpp"
#include "served_log.hpp"

using namespace dplb::balancer;
using dplb::balancer::test::in_cluster;
using dplb::balancer::test::served_log;

namespace {

queue_share of(std::uint64_t tenant, std::uint32_t weight = 1, std::uint64_t cost = 1) {
  queue_share share;
  share.tenant = tenant;
  share.weight = weight;
  share.cost = cost;
  return share;
}

queue_share at_priority(std::int64_t priority) {
  queue_share share;
  share.priority = priority;
  return share;
}

pick_context pinned_to(std::size_t rank) {
  pick_context request;
  request.pinned_rank = rank;
  return request;
}

balancer one_slot(std::size_t max_waiting = 1024) {
  return balancer(1, make_policy("least-inflight"),
                  queue_limits{.max_inflight_per_rank = 1, .max_waiting = max_waiting});
}

}  // namespace

TEST_CASE("the lowest priority value is served first, and equal priorities in their order of arrival",
          "[balancer][queue][fair]") {
  auto b = one_slot();
  served_log log(b);
  log.take(b.acquire());
  log.queue("p5 first", at_priority(5));
  log.queue("p0 first", at_priority(0));
  log.queue("p5 second", at_priority(5));
  log.queue("p-1", at_priority(-1));
  log.queue("p0 second", at_priority(0));
  for (int i = 0; i < 5; ++i) log.release_one();
  CHECK(log.order == std::vector<std::string>{"p-1", "p0 first", "p0 second", "p5 first", "p5 second"});
  log.held.clear();
  CHECK(b.inflight(0) == 0);
  CHECK(b.waiting() == 0);
}

TEST_CASE("a freed slot goes to the lowest priority over a rank's pinned line and its cluster's line, and each "
          "cluster orders its own waiters",
          "[balancer][queue][fair][clusters]") {
  const std::size_t clusters[] = {0, 1};
  std::vector<std::unique_ptr<policy>> policies;
  policies.push_back(make_policy("least-inflight"));
  policies.push_back(make_policy("least-inflight"));
  balancer b(clusters, std::move(policies), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 64});
  served_log log(b);
  log.take(b.acquire(in_cluster(0)));
  log.take(b.acquire(in_cluster(1)));
  log.queue("pinned p1", at_priority(1), pinned_to(0));
  log.queue("c0 p2", at_priority(2), in_cluster(0));
  log.queue("c1 p3", at_priority(3), in_cluster(1));
  log.queue("c0 p0", at_priority(0), in_cluster(0));
  log.queue("c1 p-2", at_priority(-2), in_cluster(1));
  // Cluster 1's waiters, however soon, never take cluster 0's slot.
  log.release_one();  // rank 0
  log.release_one();  // rank 1
  log.release_one();  // rank 0 again
  log.release_one();  // rank 1 again
  log.release_one();  // rank 0 again
  CHECK(log.order == std::vector<std::string>{"c0 p0", "c1 p-2", "pinned p1", "c1 p3", "c0 p2"});
  log.held.clear();
  CHECK(b.waiting() == 0);
  CHECK(b.queue_bands() == 0);
}

TEST_CASE("tenants of weights 3 and 1, both backlogged, are served exactly 3 to 1", "[balancer][queue][fair]") {
  auto b = one_slot();
  served_log log(b);
  log.take(b.acquire());
  for (int i = 0; i < 40; ++i) {
    log.queue("a" + std::to_string(i), of(1, 3));
    log.queue("b" + std::to_string(i), of(2, 1));
  }
  for (int i = 0; i < 40; ++i) log.release_one();
  CHECK(log.served('a', 20) == 15);
  CHECK(log.served('b', 20) == 5);
  CHECK(log.served('a', 40) == 30);
  CHECK(log.served('b', 40) == 10);
  CHECK(b.waiting_of(1) == 10);
  CHECK(b.waiting_of(2) == 30);
}

TEST_CASE("requests are fair by cost: a tenant whose requests cost 4 gets a quarter as many served",
          "[balancer][queue][fair]") {
  auto b = one_slot();
  served_log log(b);
  log.take(b.acquire());
  for (int i = 0; i < 40; ++i) {
    if (i < 20) log.queue("heavy" + std::to_string(i), of(1, 1, 4));
    log.queue("light" + std::to_string(i), of(2, 1, 1));
  }
  for (int i = 0; i < 25; ++i) log.release_one();
  CHECK(log.served('h', 25) == 5);
  CHECK(log.served('l', 25) == 20);
  // A weight scales the cost: weight 4 at cost 4 is even with weight 1 at cost 1.
  auto even = one_slot();
  served_log log2(even);
  log2.take(even.acquire());
  for (int i = 0; i < 10; ++i) {
    log2.queue("heavy" + std::to_string(i), of(1, 4, 4));
    log2.queue("light" + std::to_string(i), of(2, 1, 1));
  }
  for (int i = 0; i < 10; ++i) log2.release_one();
  CHECK(log2.served('h', 10) == 5);
}

TEST_CASE("a tenant arriving late goes ahead of another tenant's backlog", "[balancer][queue][fair]") {
  auto b = one_slot();
  served_log log(b);
  log.take(b.acquire());
  for (int i = 0; i < 20; ++i) log.queue("flood" + std::to_string(i), of(1));
  for (int i = 0; i < 5; ++i) log.release_one();
  REQUIRE(log.order.back() == "flood4");
  log.queue("light", of(2));
  log.release_one();
  CHECK(log.order.back() == "light");
  // Then the flood goes on where it was, and the light tenant, once more, after one of it.
  log.queue("light again", of(2));
  log.release_one();
  log.release_one();
  CHECK(log.order[6] == "flood5");
  CHECK(log.order[7] == "light again");
}

TEST_CASE("one tenant's requests are served in their order of arrival, whatever the others do",
          "[balancer][queue][fair]") {
  auto b = one_slot();
  served_log log(b);
  log.take(b.acquire());
  std::mt19937 random(7);
  std::vector<std::pair<std::string, std::uint64_t>> arrivals;  // (label, waiter id)
  std::set<std::string> gave_up;
  const char tenants[] = {'a', 'b', 'c'};
  for (std::size_t i = 0; i < 90; ++i) {
    const char t = tenants[random() % 3];
    const auto weight = static_cast<std::uint32_t>(1 + (t - 'a') * 2);
    const auto cost = static_cast<std::uint64_t>(1 + random() % 5);
    const std::string label = std::string(1, t) + std::to_string(i);
    arrivals.emplace_back(label, log.queue(label, of(static_cast<std::uint64_t>(t), weight, cost)));
    // Some give up, often not the last of their tenant: the others keep their order.
    if (i % 9 == 4 && b.cancel_wait(arrivals[i - 3].second)) gave_up.insert(arrivals[i - 3].first);
    if (i % 2 == 1) log.release_one();  // served while others still arrive
  }
  while (b.waiting() > 0) log.release_one();
  REQUIRE(gave_up.size() >= 5);
  for (const char t : tenants) {
    std::vector<std::string> queued, served;
    for (const auto& [label, id] : arrivals) {
      if (label.front() == t && !gave_up.contains(label)) queued.push_back(label);
    }
    std::copy_if(log.order.begin(), log.order.end(), std::back_inserter(served),
                 [t](const std::string& l) { return l.front() == t; });
    CHECK(served == queued);
  }
  CHECK(b.queue_bands() == 0);
}

TEST_CASE("a tenant with max_queued waiters is refused, exactly, and other tenants still queue",
          "[balancer][queue][fair]") {
  auto b = one_slot(/*max_waiting=*/4);
  served_log log(b);
  log.take(b.acquire());
  auto limited = of(1);
  limited.max_queued = 2;
  log.queue("a0", limited);
  const auto a1 = log.queue("a1", limited);
  CHECK(b.waiting_of(1) == 2);
  auto refused = b.acquire_or_wait({}, {}, limited, [](rank_lease) { FAIL("a refused request is never served"); });
  CHECK(refused.state == wait_state::tenant_queue_full);
  CHECK_FALSE(refused.lease);
  CHECK(b.waiting_of(1) == 2);
  log.queue("b0", of(2));  // another tenant still queues
  CHECK(b.waiting_of(2) == 1);
  CHECK(b.waiting() == 3);
  // One of its waiters served: it may queue one more.
  log.release_one();
  REQUIRE(log.order == std::vector<std::string>{"a0"});
  CHECK(b.waiting_of(1) == 1);
  log.queue("a2", limited);
  CHECK(b.waiting_of(1) == 2);
  // The whole queue full (max_waiting 4): another tenant is refused for the queue, not for its share.
  log.queue("b1", of(2));
  auto full = b.acquire_or_wait({}, {}, of(3), [](rank_lease) { FAIL("a refused request is never served"); });
  CHECK(full.state == wait_state::queue_full);
  CHECK(b.waiting_of(3) == 0);
  // A waiter that gave up no longer counts.
  REQUIRE(b.cancel_wait(a1));
  CHECK(b.waiting_of(1) == 1);
  CHECK(b.waiting_of(2) == 2);
  while (b.waiting() > 0) log.release_one();
  CHECK(b.waiting_of(1) == 0);
  CHECK(b.waiting_of(2) == 0);
  log.held.clear();  // no waiter left: nothing is delivered as they go

  SECTION("max_queued 0: never queues, yet a free slot is taken at once") {
    auto never = of(4);
    never.max_queued = 0;
    auto at_once = b.acquire_or_wait({}, {}, never, [](rank_lease) {});
    CHECK(at_once.state == wait_state::served);
    REQUIRE(at_once.lease);
    auto second = b.acquire_or_wait({}, {}, never, [](rank_lease) {});
    CHECK(second.state == wait_state::tenant_queue_full);
    CHECK(b.waiting_of(4) == 0);
  }
}

TEST_CASE("a waiter that gives up costs its tenant nothing: its tag is rolled back", "[balancer][queue][fair]") {
  auto b = one_slot();
  served_log log(b);
  log.take(b.acquire());
  log.queue("a1", of(1));  // starts at 0
  const auto a2 = log.queue("a2", of(1));  // starts at 1
  log.queue("b1", of(2));  // starts at 0
  log.queue("b2", of(2));  // starts at 1
  log.queue("b3", of(2));  // starts at 2
  REQUIRE(b.cancel_wait(a2));
  // a3 starts where a2 would have (1), after b2 (same start, earlier), before b3; without the rollback it
  // would start at 2, after b3.
  log.queue("a3", of(1));
  for (int i = 0; i < 5; ++i) log.release_one();
  CHECK(log.order == std::vector<std::string>{"a1", "b1", "b2", "a3", "b3"});

  SECTION("a waiter that was not its tenant's last is not rolled back") {
    // The band emptied: it starts again at 0.
    log.queue("c1", of(3));                   // starts at 0
    const auto c2 = log.queue("c2", of(3));   // starts at 1
    log.queue("c3", of(3));                   // starts at 2
    log.queue("d1", of(4));                   // starts at 0
    log.queue("d2", of(4));                   // starts at 1
    log.queue("d3", of(4));                   // starts at 2
    REQUIRE(b.cancel_wait(c2));               // c3 was tagged after it: nothing rolls back
    log.queue("c4", of(3));                   // starts at 3 (rolled back, it would start at 1, ahead of c3)
    log.queue("d4", of(4));                   // starts at 3, after c4
    for (int i = 0; i < 6; ++i) log.release_one();
    CHECK(std::vector<std::string>(log.order.begin() + 5, log.order.end()) ==
          std::vector<std::string>{"c1", "d1", "d2", "c3", "d3", "c4"});
  }
  while (b.waiting() > 0) log.release_one();
  log.held.clear();
  CHECK(b.queue_bands() == 0);
}

TEST_CASE("a priority band is forgotten once it has no waiter", "[balancer][queue][fair]") {
  auto b = one_slot();
  served_log log(b);
  log.take(b.acquire());
  CHECK(b.queue_bands() == 0);
  log.queue("p0", at_priority(0));
  const auto p2 = log.queue("p2", at_priority(2));
  log.queue("p1", at_priority(1));
  CHECK(b.queue_bands() == 3);
  log.release_one();  // p0 served
  CHECK(b.queue_bands() == 2);
  REQUIRE(b.cancel_wait(p2));
  CHECK(b.queue_bands() == 1);
  log.release_one();  // p1 served
  CHECK(b.queue_bands() == 0);
  // Turned away (its rank removed) and dropped at close: the same.
  log.queue("pinned", at_priority(3), pinned_to(0));
  CHECK(b.queue_bands() == 1);
  b.set_flag(0, rank_flag::removed, true);
  CHECK(b.queue_bands() == 0);
  CHECK(b.waiting_of(0) == 0);
  b.set_flag(0, rank_flag::removed, false);
  log.queue("dropped", at_priority(4));
  CHECK(b.queue_bands() == 1);
  b.close();
  CHECK(b.queue_bands() == 0);
  CHECK(b.waiting_of(0) == 0);
}

TEST_CASE("a rank's pinned line and its line of waiters whose place it is both go by priority",
          "[balancer][queue][fair][prefix]") {
  balancer b(2, std::make_unique<prefix_aware>(prefix_aware_options{}, nullptr),
             queue_limits{.max_inflight_per_rank = 1, .max_waiting = 16});
  prefix_chain_builder builder(0);
  builder.feed(std::string(8 * prefix_block_bytes, 'a'));
  const auto chain_a = builder.take();
  prefix_chain_builder other(0);
  other.feed(std::string(8 * prefix_block_bytes, 'x'));
  const auto chain_x = other.take();
  pick_context with_a;
  with_a.prefix_chain = chain_a;
  pick_context with_x;
  with_x.prefix_chain = chain_x;
  served_log log(b);
  log.take(b.acquire(with_a));  // rank 0: group a's place
  log.take(b.acquire(with_x));  // rank 1: group x's place
  REQUIRE(log.held[0].rank() == 0);
  REQUIRE(log.held[1].rank() == 1);

  SECTION("pinned") {
    log.queue("pinned p3", at_priority(3), pinned_to(0));
    log.queue("pinned p1", at_priority(1), pinned_to(0));
    log.release_one();  // rank 0
    CHECK(log.order == std::vector<std::string>{"pinned p1"});
    CHECK(log.held.back().rank() == 0);
  }
  SECTION("preferring") {
    log.queue("a p3", at_priority(3), with_a);
    log.queue("a p1", at_priority(1), with_a);
    log.release_one();  // rank 0: the place of both
    CHECK(log.order == std::vector<std::string>{"a p1"});
    CHECK(log.held.back().rank() == 0);
  }
  while (b.waiting() > 0) log.release_one();
  log.held.clear();
  CHECK(b.waiting() == 0);
  CHECK(b.queue_bands() == 0);
}

TEST_CASE("the fair queue under concurrency: mixed shares, cancels and releases leave nothing behind",
          "[balancer][queue][fair]") {
  balancer b(3, make_policy("least-inflight"), queue_limits{.max_inflight_per_rank = 1, .max_waiting = 8});
  // One request's wait: the lease comes from whichever thread frees a slot.
  struct slot_wait {
    std::mutex mutex;
    std::condition_variable ready;
    rank_lease lease;
    bool delivered = false;
  };
  std::atomic<unsigned> served{0}, queued{0}, cancelled{0}, refused{0}, lost{0};
  constexpr int threads = 6;
  constexpr int rounds = 400;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t) + 1);
      for (int i = 0; i < rounds; ++i) {
        queue_share share;
        share.priority = static_cast<std::int64_t>(random() % 3);
        share.tenant = random() % 4;
        share.weight = static_cast<std::uint32_t>(random() % 4);  // 0 is taken as 1
        share.cost = random() % 6;                                 // so is 0
        share.max_queued = 1 + share.tenant;
        const auto request = random() % 5 == 0 ? pinned_to(random() % 3) : pick_context{};
        auto wait = std::make_shared<slot_wait>();
        auto out = b.acquire_or_wait(request, {}, share, [wait](rank_lease lease) {
          std::lock_guard lock(wait->mutex);
          wait->lease = std::move(lease);
          wait->delivered = true;
          wait->ready.notify_one();
        });
        rank_lease lease = std::move(out.lease);
        if (out.state == wait_state::queued) {
          ++queued;
          if (random() % 3 == 0 && b.cancel_wait(out.waiter_id)) {
            ++cancelled;
            continue;
          }
          std::unique_lock lock(wait->mutex);
          if (!wait->ready.wait_for(lock, std::chrono::seconds(20), [&] { return wait->delivered; })) {
            lock.unlock();
            ++lost;
            b.cancel_wait(out.waiter_id);
            continue;
          }
          lease = std::move(wait->lease);
        } else if (out.state != wait_state::served) {
          ++refused;
          continue;
        }
        if (lease) ++served;
        if (random() % 2 == 0) std::this_thread::yield();
        lease.release();
      }
    });
  }
  for (auto& w : workers) w.join();
  WARN(served.load() << " served, " << queued.load() << " queued, " << cancelled.load() << " cancelled, "
                     << refused.load() << " refused");
  CHECK(lost.load() == 0);
  CHECK(queued.load() > 0);
  CHECK(b.waiting() == 0);
  CHECK(b.queue_bands() == 0);
  for (std::uint64_t tenant = 0; tenant < 4; ++tenant) CHECK(b.waiting_of(tenant) == 0);
  for (std::size_t r = 0; r < 3; ++r) CHECK(b.inflight(r) == 0);
}
