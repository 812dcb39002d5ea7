// Long prompts in dplb's queue (queue_limits::long_prompt_tokens): a queued long prompt is not given a slot on
// a rank still prefilling another long prompt while some other usable rank is not; the slot goes to the next
// waiter it suits, and the long prompt takes the next slot freed on a rank that is not prefilling one, or the
// passed-over rank once its prefill ends (rank_lease::prompt_done), or any slot after long_prompt_hold.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/least_inflight.hpp"
#include "fifo_wait.hpp"

using namespace dplb::balancer;
using namespace std::chrono_literals;
using dplb::balancer::test::acquire_or_wait_fifo;

namespace {

constexpr std::uint32_t long_tokens = 1000;

pick_context prompt_of(std::uint32_t tokens) {
  pick_context c;
  c.prompt_tokens = tokens;
  return c;
}

pick_context long_prompt() { return prompt_of(4 * long_tokens); }
pick_context short_prompt() { return prompt_of(64); }

balancer two_ranks_of_two(std::chrono::milliseconds hold = 10s, std::uint32_t threshold = long_tokens) {
  return balancer(2, std::make_unique<least_inflight>(),
                  queue_limits{.max_inflight_per_rank = 2, .max_waiting = 64, .long_prompt_tokens = threshold,
                               .long_prompt_hold = hold});
}

// Waiters and the leases handed to them, by the order in which they queued.
struct waiters {
  explicit waiters(balancer& owner) : b(owner) {}
  // Drops the waiters left before the leases go: a lease released here must not deliver into `delivered`
  // while it is being destroyed.
  ~waiters() { b.close(); }
  balancer& b;
  std::vector<std::pair<std::size_t, rank_lease>> delivered;  // (waiter, lease)
  std::size_t count = 0;

  std::size_t queue(const pick_context& request) {
    const std::size_t index = count++;
    std::uint64_t id = 0;
    bool queued = false;
    auto now = acquire_or_wait_fifo(
        b, request, {}, [this, index](rank_lease l) { delivered.emplace_back(index, std::move(l)); }, id, queued);
    REQUIRE_FALSE(now);
    REQUIRE(queued);
    return index;
  }
  std::optional<std::size_t> rank_of(std::size_t waiter) const {
    for (const auto& [w, lease] : delivered) {
      if (w == waiter && lease) return lease.rank();
    }
    return std::nullopt;
  }
  rank_lease* lease_of(std::size_t waiter) {
    for (auto& [w, lease] : delivered) {
      if (w == waiter) return &lease;
    }
    return nullptr;
  }
};

// Both ranks full: rank 0 prefilling a long prompt beside a short one, rank 1 two short ones.
struct rank_0_prefilling_long {
  explicit rank_0_prefilling_long(balancer& b)
      : long_on_0(b.acquire(long_prompt())), short_on_1(b.acquire(short_prompt())) {
    REQUIRE(long_on_0.rank() == 0);
    REQUIRE(short_on_1.rank() == 1);
    short_on_0 = b.acquire(short_prompt());
    other_on_1 = b.acquire(short_prompt());
    REQUIRE(short_on_0.rank() == 0);
    REQUIRE(other_on_1.rank() == 1);
  }
  rank_lease long_on_0, short_on_1, short_on_0, other_on_1;
};

}  // namespace

TEST_CASE("a queued long prompt passes over a rank prefilling another, and the short one behind it takes that slot",
          "[balancer][queue][long-prompts]") {
  auto b = two_ranks_of_two();
  rank_0_prefilling_long full(b);
  waiters w(b);
  const auto long_waiter = w.queue(long_prompt());
  const auto short_waiter = w.queue(short_prompt());
  // Rank 0 frees a slot while it still prefills the long prompt: the long waiter passes it over, the short
  // one behind it takes it.
  full.short_on_0.release();
  REQUIRE(w.delivered.size() == 1);
  CHECK(w.rank_of(short_waiter) == 0u);
  CHECK(b.waiting() == 1);
  // Rank 1 frees: the long waiter takes it.
  full.short_on_1.release();
  REQUIRE(w.delivered.size() == 2);
  CHECK(w.rank_of(long_waiter) == 1u);
  CHECK(b.waiting() == 0);
}

TEST_CASE("a passed-over rank is the long prompt's once its prefill ends", "[balancer][queue][long-prompts]") {
  auto b = two_ranks_of_two();
  rank_0_prefilling_long full(b);
  waiters w(b);
  const auto long_waiter = w.queue(long_prompt());
  full.short_on_0.release();  // room on rank 0 only, which still prefills
  CHECK(w.delivered.empty());
  CHECK(b.waiting() == 1);
  full.long_on_0.prompt_done();  // its first byte came: the prefill is over
  REQUIRE(w.delivered.size() == 1);
  CHECK(w.rank_of(long_waiter) == 0u);
  // The new long prompt prefills on rank 0 now; its own first byte frees the rank for the next one.
  REQUIRE(w.lease_of(long_waiter));
  rank_lease taken = std::move(*w.lease_of(long_waiter));
  const auto next = w.queue(long_prompt());
  full.short_on_1.release();  // rank 1 is not prefilling a long prompt: the next one goes there at once
  CHECK(w.rank_of(next) == 1u);
  taken.prompt_done();
  taken.release();
  CHECK(b.inflight(0) == 1);
}

TEST_CASE("a long prompt passes over a prefilling rank for at most long_prompt_hold", "[balancer][queue][long-prompts]") {
  const auto hold = 200ms;  // long enough that the first reconsider() comes within it, on a slow machine too
  auto b = two_ranks_of_two(hold);
  CHECK(b.long_prompt_hold() == hold);
  rank_0_prefilling_long full(b);
  waiters w(b);
  const auto long_waiter = w.queue(long_prompt());
  full.short_on_0.release();
  b.reconsider();  // within its hold: it still passes rank 0 over
  CHECK(w.delivered.empty());
  // The hold itself is what is tested: time must pass. (The waiting session wakes at its hold's end and
  // calls reconsider(), as here.)
  const auto deadline = std::chrono::steady_clock::now() + hold + 5ms;
  while (std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  b.reconsider();
  CHECK(w.rank_of(long_waiter) == 0u);
}

TEST_CASE("a long prompt takes any slot when every rank is prefilling one, or when spreading is off",
          "[balancer][queue][long-prompts]") {
  SECTION("every rank prefilling a long prompt") {
    auto b = two_ranks_of_two();
    auto long_0 = b.acquire(long_prompt());
    auto long_1 = b.acquire(long_prompt());
    auto short_0 = b.acquire(short_prompt());
    auto short_1 = b.acquire(short_prompt());
    REQUIRE(long_0.rank() != long_1.rank());
    waiters w(b);
    const auto long_waiter = w.queue(long_prompt());
    const auto freed = short_0.rank();
    short_0.release();
    CHECK(w.rank_of(long_waiter) == freed);
  }
  SECTION("--long-prompt-tokens 0") {
    auto b = two_ranks_of_two(10s, 0);
    rank_0_prefilling_long full(b);
    waiters w(b);
    const auto long_waiter = w.queue(long_prompt());
    const auto short_waiter = w.queue(short_prompt());
    full.short_on_0.release();
    CHECK(w.rank_of(long_waiter) == 0u);  // FIFO
    CHECK_FALSE(w.rank_of(short_waiter));
  }
  SECTION("a prompt just under the threshold") {
    auto b = two_ranks_of_two();
    rank_0_prefilling_long full(b);
    waiters w(b);
    const auto waiter = w.queue(prompt_of(long_tokens - 1));
    full.short_on_0.release();
    CHECK(w.rank_of(waiter) == 0u);
  }
}

TEST_CASE("a long prompt arriving to room only on a prefilling rank waits, and a short arrival takes that room",
          "[balancer][queue][long-prompts]") {
  auto b = two_ranks_of_two();
  rank_0_prefilling_long full(b);
  full.short_on_0.release();  // room on rank 0, which prefills a long prompt; rank 1 full
  waiters w(b);
  const auto long_waiter = w.queue(long_prompt());  // REQUIREs that it queued
  // A short request arriving now takes the room the long one passed over, although it came later.
  std::uint64_t id = 0;
  bool queued = false;
  std::optional<rank_lease> short_now;
  std::optional<std::size_t> short_rank;
  auto lease = acquire_or_wait_fifo(
      b, short_prompt(), {}, [&](rank_lease l) { short_rank = l.rank(); short_now.emplace(std::move(l)); }, id, queued);
  // It queues behind the long waiter (no jumping a line with waiters) and is served in the same call.
  CHECK_FALSE(lease);
  CHECK(queued);
  CHECK(short_rank == 0u);
  CHECK_FALSE(w.rank_of(long_waiter));
  CHECK(b.waiting() == 1);
  full.other_on_1.release();
  CHECK(w.rank_of(long_waiter) == 1u);
  CHECK(b.waiting() == 0);
}

TEST_CASE("the long prefill counted on a rank ends with the prefill or the request, never twice",
          "[balancer][queue][long-prompts]") {
  auto b = two_ranks_of_two();
  std::size_t rank = 0;
  SECTION("prefilled, then released") {
    auto a = b.acquire(long_prompt());
    rank = a.rank();
    a.prompt_done();
    a.prompt_done();  // only the first call counts (a second count off would wrap the rank's count round)
  }
  SECTION("released before its prefill ended") {
    auto a = b.acquire(long_prompt());
    rank = a.rank();
  }
  // Both ranks full of short requests; a queued long prompt must take a slot freed on that rank, which would
  // be passed over if anything were left counted on it (the other rank prefills nothing).
  std::vector<rank_lease> shorts;
  for (int i = 0; i < 4; ++i) shorts.push_back(b.acquire(short_prompt()));
  REQUIRE(b.inflight(0) == 2);
  REQUIRE(b.inflight(1) == 2);
  waiters w(b);
  const auto long_waiter = w.queue(long_prompt());
  for (auto& s : shorts) {
    if (s.rank() == rank) {
      s.release();
      break;
    }
  }
  CHECK(w.rank_of(long_waiter) == rank);
}

TEST_CASE("a burst of long prompts still lands exactly even", "[balancer][queue][long-prompts]") {
  balancer b(4, std::make_unique<least_inflight>(),
             queue_limits{.max_inflight_per_rank = 64, .max_waiting = 1024, .long_prompt_tokens = long_tokens});
  std::vector<rank_lease> held;
  for (int i = 0; i < 256; ++i) {
    std::uint64_t id = 0;
    bool queued = false;
    auto lease = acquire_or_wait_fifo(b, long_prompt(), {}, [](rank_lease) {}, id, queued);
    REQUIRE(lease);
    held.push_back(std::move(lease));
  }
  for (std::size_t r = 0; r < 4; ++r) CHECK(b.inflight(r) == 64);
}
