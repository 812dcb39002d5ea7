// The queue (--max-inflight-per-rank) under concurrency and at shutdown: every freed slot reaches a
// waiter whatever the interleaving, a delivery may do anything with its lease, including dropping it,
// and once closed the queue delivers to nobody.

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/balancer/prefix_index.hpp"
#include "fifo_wait.hpp"

using dplb::balancer::balancer;
using dplb::balancer::make_policy;
using dplb::balancer::pick_context;
using dplb::balancer::prefix_aware;
using dplb::balancer::prefix_aware_options;
using dplb::balancer::prefix_block_bytes;
using dplb::balancer::prefix_chain_builder;
using dplb::balancer::queue_limits;
using dplb::balancer::rank_lease;
using dplb::balancer::test::acquire_or_wait_fifo;
using clock_type = std::chrono::steady_clock;

namespace {

// Spins until `flag` reaches at least `value` or the deadline passes; false on the deadline. Both
// threads of a round spin (no sleeping, no futex) so that they run their steps within nanoseconds of
// each other.
bool spin_until(const std::atomic<unsigned>& flag, unsigned value, clock_type::time_point deadline) {
  for (unsigned i = 0; flag.load() < value; ++i) {
    if ((i & 1023) == 0 && clock_type::now() > deadline) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a slot freed while another thread enqueues always reaches the waiter", "[balancer][queue]") {
  // One thread frees the only slot (a release, or a rank becoming usable) while the other finds every
  // rank full and enqueues. Whatever the interleaving, the request must end up with a slot before both
  // steps have returned: either it took the freed slot at once, or the freeing step served it. A waiter
  // left in the queue with a free slot beside it is stranded until some unrelated event.
  const auto freeing = GENERATE(as<std::string>{}, "release", "set_usable", "release of its prefix's rank");
  INFO("the slot is freed by " << freeing);
  // set_usable: rank 0 is busy and rank 1 unusable, so the waiter can only be served by rank 1 coming back.
  // Its prefix's rank: rank 1 has room all along, but the request's prefix is on rank 0, within the load
  // bound: it holds out for rank 0, and must get its slot.
  const bool placed = freeing == "release of its prefix's rank";
  const std::size_t ranks = freeing == "release" ? 1 : 2;
  balancer b(ranks, placed ? std::make_unique<prefix_aware>(prefix_aware_options{}, nullptr) : make_policy("least-inflight"),
             queue_limits{1, 16});
  prefix_chain_builder prompt;
  prompt.feed(std::string(4 * prefix_block_bytes, 'p'));
  const auto chain = prompt.take();
  pick_context request;
  if (placed) request.prefix_chain = chain;

  rank_lease holder;                  // the busy slot of each round
  std::atomic<unsigned> started{0};   // the round the freeing thread may run
  std::atomic<unsigned> finished{0};  // the last round the freeing thread completed
  std::atomic<bool> quit{false};
  const auto deadline = clock_type::now() + std::chrono::seconds(20);
  std::thread freer([&] {
    for (unsigned round = 1;; ++round) {
      if (!spin_until(started, round, deadline) || quit.load()) return;
      // A varying head start for the enqueuer sweeps the two steps across each other's critical moments.
      for (unsigned spin = round % 97; spin > 0; --spin) std::atomic_signal_fence(std::memory_order_seq_cst);
      if (freeing != "set_usable") {
        holder.release();
      } else {
        b.set_flag(1, dplb::balancer::rank_flag::unhealthy, false);
      }
      finished.store(round);
    }
  });

  constexpr unsigned rounds = 30'000;
  unsigned stranded = 0, queued_rounds = 0, completed = 0;
  for (unsigned round = 1; round <= rounds && clock_type::now() < deadline; ++round) {
    if (freeing == "set_usable") b.set_flag(1, dplb::balancer::rank_flag::unhealthy, true);
    holder = b.acquire(request);  // rank 0: the only usable one, or where the prefix is
    REQUIRE(holder);
    REQUIRE(holder.rank() == 0);
    rank_lease delivered;
    std::atomic<bool> was_delivered{false};
    std::uint64_t id = 0;
    bool queued = false;
    started.store(round);
    auto now = acquire_or_wait_fifo(b, request, {},
        [&](rank_lease lease) {
          delivered = std::move(lease);
          was_delivered.store(true);
        },
        id, queued);
    if (!spin_until(finished, round, deadline)) {
      // Out of time mid-round: the freeing thread may still deliver to this round's locals. Stop it first,
      // then take the waiter out, before they go out of scope.
      quit.store(true);
      started.store(rounds + 1);
      freer.join();
      b.cancel_wait(id);
      break;
    }
    ++completed;
    if (queued) {
      ++queued_rounds;
      if (!was_delivered.load()) {
        ++stranded;
        CHECK(b.cancel_wait(id));  // still queued while a slot is free
      }
    } else {
      REQUIRE(now);
    }
    if (placed && (now || delivered)) CHECK((now ? now : delivered).rank() == 0);
    now.release();
    delivered.release();
    holder.release();
    for (std::size_t r = 0; r < ranks; ++r) REQUIRE(b.inflight(r) == 0);
    REQUIRE(b.waiting() == 0);
  }
  quit.store(true);
  started.store(rounds + 1);  // past any round the freeing thread may be waiting for: it sees `quit`
  if (freer.joinable()) freer.join();
  WARN(completed << " rounds, " << queued_rounds << " enqueued, " << stranded << " stranded");
  // Enough rounds to mean something (the head starts sweep 97 offsets: three sweeps at least), even under
  // ThreadSanitizer on a loaded machine, where a round costs some milliseconds.
  CHECK(completed >= 300);
  CHECK(stranded == 0);
}

TEST_CASE("a delivery that drops its lease does not deadlock the balancer", "[balancer][queue]") {
  // A delivery that fails (its waiter gone, a post that throws) drops the lease it was given, which
  // releases the slot and serves the next waiter from inside the delivery. Run on its own thread, with
  // the balancer shared, so that a deadlock fails the test instead of hanging it (the stuck thread then
  // keeps the balancer alive and is left behind).
  auto b = std::make_shared<balancer>(1, make_policy("least-inflight"), queue_limits{1, 16});
  auto holder = std::make_shared<rank_lease>(b->acquire());
  REQUIRE(*holder);
  auto deliveries = std::make_shared<std::atomic<int>>(0);
  std::uint64_t ids[2] = {};
  bool queued = false;
  for (auto& id : ids) {
    CHECK_FALSE(acquire_or_wait_fifo(*b, {}, {}, [deliveries](rank_lease) { ++*deliveries; }, id, queued));
    REQUIRE(queued);
  }
  std::promise<void> released;
  auto done = released.get_future();
  std::thread([b, holder, released = std::move(released)]() mutable {
    holder->release();
    released.set_value();
  }).detach();
  REQUIRE(done.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  // The first waiter got the slot and dropped it, which served the second, which dropped it too.
  CHECK(deliveries->load() == 2);
  CHECK(b->waiting() == 0);
  CHECK(b->inflight(0) == 0);
  CHECK(b->acquire());
}

TEST_CASE("once closed, the queue drops its waiters and no release delivers to them", "[balancer][queue]") {
  // Shutdown after a drain timeout: each waiter's delivery posts to its worker's io_context, and the
  // workers are destroyed while leases are still being released.
  balancer b(1, make_policy("least-inflight"), queue_limits{1, 16});
  auto holder = b.acquire();
  REQUIRE(holder);
  auto io = std::make_unique<boost::asio::io_context>();
  auto owned = std::make_shared<int>(0);  // stands for the session state a waiter's delivery keeps alive
  int delivered = 0;
  std::uint64_t id = 0;
  bool queued = false;
  for (int i = 0; i < 2; ++i) {
    CHECK_FALSE(acquire_or_wait_fifo(b, {}, {}, 
        [executor = io->get_executor(), owned, &delivered](rank_lease lease) {
          ++delivered;
          boost::asio::post(executor, [lease = std::move(lease)] {});
        },
        id, queued));
    REQUIRE(queued);
  }
  CHECK(owned.use_count() == 3);
  b.close();
  CHECK(b.waiting() == 0);
  CHECK(owned.use_count() == 1);  // the deliveries are destroyed, not merely skipped
  io.reset();                     // the worker goes first ...
  holder.release();               // ... and a lease it did not own is released after it
  CHECK(delivered == 0);
  CHECK(b.inflight(0) == 0);
  // A free slot is still taken at once, but nothing queues any more.
  auto busy = acquire_or_wait_fifo(b, {}, {}, [&](rank_lease) { ++delivered; }, id, queued);
  CHECK(busy);
  CHECK_FALSE(acquire_or_wait_fifo(b, {}, {}, [&](rank_lease) { ++delivered; }, id, queued));
  CHECK_FALSE(queued);
  CHECK(delivered == 0);
}
