// What a release costs under --max-inflight-per-rank when the queue is full of waiters that want particular
// ranks: the time from a lease's release() to its return, which includes serving the waiter that takes the
// freed slot (its pick, under the balancer's lock) and handing it its lease. Saturated: every rank at its
// max_inflight_per_rank; every rank has a waiter holding out for it (prefix-aware: each rank holds one prefix
// group's blocks, and a request of that group waits for its rank). Each round releases a slot on one rank
// (ranks in a shuffled order), and a new waiter for that rank queues (untimed), so every rank's line stays
// non-empty. Prints p50 and p99 in microseconds per rank count, and the growth from 64 to 256 ranks. Not a
// test: nothing is asserted.
//
//   build/dplb-queue-release-cost [releases per rank count, default 20000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/balancer/prefix_index.hpp"

using namespace dplb::balancer;

namespace {

constexpr std::uint32_t per_rank = 4;  // max_inflight_per_rank

// A prompt of 8 blocks that shares nothing with another group's (a seed of its own).
std::vector<prefix_hash> group_chain(std::size_t group) {
  prefix_chain_builder b(group + 1);
  b.feed(std::string(8 * prefix_block_bytes, 'p'));
  return b.take();
}

struct figures {
  double p50 = 0;
  double p99 = 0;
};

figures measure(std::size_t ranks, int releases) {
  balancer b(ranks, std::make_unique<prefix_aware>(prefix_aware_options{}, nullptr),
             queue_limits{.max_inflight_per_rank = per_rank, .max_waiting = 4 * ranks});
  // One prefix group per rank: routed while the ranks are idle, each group lands on a rank of its own.
  std::vector<std::vector<prefix_hash>> chain_of(ranks);
  std::vector<std::vector<rank_lease>> held(ranks);
  for (std::size_t g = 0; g < ranks; ++g) {
    auto chain = group_chain(g);
    pick_context c;
    c.prefix_chain = chain;
    auto lease = b.acquire(c);
    if (!lease || !chain_of[lease.rank()].empty()) {
      std::fprintf(stderr, "group %zu did not land on a rank of its own\n", g);
      std::exit(1);
    }
    chain_of[lease.rank()] = std::move(chain);
    held[lease.rank()].push_back(std::move(lease));
  }
  // Saturated: pinned requests fill every rank to its limit (the policy is not asked, the index is unchanged).
  for (std::size_t r = 0; r < ranks; ++r) {
    pick_context pin;
    pin.pinned_rank = r;
    while (held[r].size() < per_rank) held[r].push_back(b.acquire(pin));
  }
  std::vector<rank_lease> delivered;
  const auto queue_for = [&](std::size_t r) {
    pick_context c;
    c.prefix_chain = chain_of[r];
    auto out = b.acquire_or_wait(c, {}, queue_share{}, [&delivered](rank_lease l) { delivered.push_back(std::move(l)); });
    if (out.state != wait_state::queued) {
      std::fprintf(stderr, "a waiter for rank %zu did not queue\n", r);
      std::exit(1);
    }
  };
  for (std::size_t r = 0; r < ranks; ++r) queue_for(r);
  std::vector<std::size_t> order(ranks);
  for (std::size_t r = 0; r < ranks; ++r) order[r] = r;
  std::mt19937 rng(7);
  std::vector<double> micros;
  micros.reserve(static_cast<std::size_t>(releases));
  delivered.reserve(4);
  for (int i = 0; i < releases; ++i) {
    if (i % static_cast<int>(ranks) == 0) std::shuffle(order.begin(), order.end(), rng);
    const std::size_t r = order[static_cast<std::size_t>(i) % ranks];
    auto lease = std::move(held[r].front());
    held[r].erase(held[r].begin());
    const auto start = std::chrono::steady_clock::now();
    lease.release();
    const auto took = std::chrono::steady_clock::now() - start;
    micros.push_back(std::chrono::duration<double, std::micro>(took).count());
    if (delivered.size() != 1 || !delivered.front() || delivered.front().rank() != r) {
      std::fprintf(stderr, "release %d on rank %zu: the waiter for it was not served there\n", i, r);
      std::exit(1);
    }
    held[r].push_back(std::move(delivered.front()));
    delivered.clear();
    queue_for(r);
  }
  b.close();  // the waiters left go before `delivered` and the leases: none is handed over as they are destroyed
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double q) { return micros[static_cast<std::size_t>(q * static_cast<double>(micros.size() - 1))]; };
  return {at(0.50), at(0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  const int releases = argc > 1 ? std::max(100, std::atoi(argv[1])) : 20000;
  std::printf("| ranks | waiters | release p50, us | release p99, us |\n|---:|---:|---:|---:|\n");
  figures at64{};
  figures at256{};
  for (const std::size_t ranks : {4u, 64u, 256u}) {
    const auto f = measure(ranks, releases);
    std::printf("| %zu | %zu | %.2f | %.2f |\n", ranks, ranks, f.p50, f.p99);
    if (ranks == 64) at64 = f;
    if (ranks == 256) at256 = f;
  }
  std::printf("\ngrowth 64 -> 256 ranks (4x): p50 x%.2f, p99 x%.2f\n", at256.p50 / at64.p50, at256.p99 / at64.p99);
}
