// Two replicas' balancers picking through one ledger in a real redis-server (replica_ledger.hpp): their
// picks count every replica's requests, each is counted in its own balancer before the answer is handed
// over, and releases give the ledger's counts back.
#include "dplb/balancer/replica_ledger.hpp"

#include "dplb/balancer/least_inflight.hpp"

#include "../../support/redis_server.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace dplb::balancer;
using dplb::test::redis_server;
using dplb::test::scaled;
using namespace std::chrono_literals;

namespace {

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds deadline = 5000ms) {
  const auto until = std::chrono::steady_clock::now() + scaled(deadline);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(2ms);  // paces the polling; the predicate is the event
  }
  return true;
}

replica_ledger_options options_for(std::uint16_t port, const std::string& name) {
  replica_ledger_options o;
  o.ledger.endpoint.host = "127.0.0.1";
  o.ledger.endpoint.port = port;
  o.ledger.ns = "replica-ledger-test";
  o.ledger.replica = name;
  o.ledger.timeout = scaled(1000ms);  // these tests are about what is decided, not how fast
  o.rules = {dplb::ledger::ledger_policy::least_inflight};
  return o;
}

// One dplb replica: its balancer over `ranks` ranks and its link to the ledger.
struct replica {
  replica(std::uint16_t port, const std::string& name, std::size_t ranks = 4, queue_limits limits = {})
      : counts(ranks, std::make_unique<least_inflight>(), limits), ledger(counts, options_for(port, name)) {
    ledger.start();
    counts.set_release_listener(&ledger);
  }
  ~replica() {
    counts.set_release_listener(nullptr);
    ledger.stop();
  }

  // A pick through the ledger, its lease handed over (empty: the caller would pick alone, or wait).
  rank_lease pick(replica_ledger::pick_outcome* said = nullptr) {
    std::promise<std::pair<rank_lease, replica_ledger::pick_outcome>> answer;
    auto got = answer.get_future();
    ledger.pick(pick_context{}, request_cost{}, [&](rank_lease lease, replica_ledger::pick_outcome outcome) {
      answer.set_value({std::move(lease), outcome});
    });
    auto [lease, outcome] = got.get();
    if (said) *said = outcome;
    return std::move(lease);
  }

  balancer counts;
  replica_ledger ledger;
};

}  // namespace

TEST_CASE("two replicas' picks through one ledger spread a burst exactly, and releases give the counts back",
          "[ledger][balancer]") {
  redis_server redis;
  replica a(redis.port(), "a");
  replica b(redis.port(), "b");
  REQUIRE(eventually([&] { return a.ledger.up() && b.ledger.up(); }));
  REQUIRE(a.ledger.picks(pick_context{}));

  // 9 through a, 7 through b, interleaved unevenly: 4 on each rank over both.
  std::vector<rank_lease> held;
  std::map<std::size_t, int> per_rank;
  for (int i = 0; i < 16; ++i) {
    auto lease = (i % 3 == 2 || i >= 14) ? b.pick() : a.pick();
    REQUIRE(lease);
    ++per_rank[lease.rank()];
    held.push_back(std::move(lease));
  }
  for (std::size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(per_rank[rank] == 4);
    // Counted in the replica's own balancer as it was handed over.
    CHECK(a.counts.inflight(rank) + b.counts.inflight(rank) == 4);
  }
  CHECK(a.ledger.shared_picks() + b.ledger.shared_picks() == 16);
  CHECK(a.ledger.replicas() == 2);
  // Each replica's last answer told it the others' requests: what the picks it makes alone weigh.
  for (std::size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(b.counts.others(rank) + b.counts.inflight(rank) >= 3);  // as of b's last answer (the 14th, 15th pick)
    CHECK(b.counts.others(rank) <= 4 - b.counts.inflight(rank));
  }

  // Every lease released: the ledger holds nothing.
  held.clear();
  REQUIRE(eventually([&] {
    std::promise<dplb::ledger::ledger_view> view;
    auto got = view.get_future();
    a.ledger.view([&](const dplb::ledger::ledger_view& v) { view.set_value(v); });
    const auto v = got.get();
    return v.ok && v.total.empty();
  }));
}

TEST_CASE("the ledger offers only the ranks usable here, and a replica whose ledger is gone picks alone",
          "[ledger][balancer]") {
  auto redis = std::make_unique<redis_server>();
  replica a(redis->port(), "a");
  REQUIRE(eventually([&] { return a.ledger.up(); }));

  // Rank 0 drained here: the ledger never offers it (candidates come from the balancer).
  a.counts.set_flag(0, rank_flag::draining, true);
  for (int i = 0; i < 6; ++i) {
    auto lease = a.pick();
    REQUIRE(lease);
    CHECK(lease.rank() != 0);
  }

  redis.reset();  // Redis gone: no pick is asked of it any more
  REQUIRE(eventually([&] { return !a.ledger.up(); }));
  CHECK_FALSE(a.ledger.picks(pick_context{}));
}

TEST_CASE("a per-rank limit holds over the replicas together, and a slot freed by one serves the other's waiter",
          "[ledger][balancer]") {
  redis_server redis;
  queue_limits one_each;
  one_each.max_inflight_per_rank = 1;
  replica a(redis.port(), "a", 2, one_each);
  replica b(redis.port(), "b", 2, one_each);
  REQUIRE(eventually([&] { return a.ledger.up() && b.ledger.up(); }));

  // Two ranks, one slot each over both replicas: a takes one, b the other, and b's next finds both full.
  auto first = a.pick();
  auto second = b.pick();
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first.rank() != second.rank());
  replica_ledger::pick_outcome said{};
  CHECK_FALSE(b.pick(&said));
  CHECK(said == replica_ledger::pick_outcome::full);

  // b waits; a's request ends: the slot it frees goes to b's waiter, counted in b's balancer.
  std::promise<rank_lease> delivered;
  auto got = delivered.get_future();
  const auto id = b.ledger.wait(pick_context{}, request_cost{}, 0,
                                [&](rank_lease lease) { delivered.set_value(std::move(lease)); });
  REQUIRE(id != 0);
  CHECK(got.wait_for(scaled(200ms)) == std::future_status::timeout);  // nothing is free yet
  const auto freed = first.rank();
  first.release();
  REQUIRE(got.wait_for(scaled(5000ms)) == std::future_status::ready);
  auto lease = got.get();
  REQUIRE(lease);
  CHECK(lease.rank() == freed);
  CHECK(b.counts.inflight(freed) == 1);
  CHECK(a.counts.inflight(freed) == 0);
  CHECK(b.ledger.waiting() == 0);
}
