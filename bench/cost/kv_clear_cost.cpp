// What a rank's cleared index costs the pickers: rank 0 of the shared KV-cache event index holds 262,144 blocks
// (--kv-index-blocks' default, full) and is cleared by an AllBlocksCleared event, as an engine sends one after
// each RLHF weight sync, while another thread does the lookup a precise pick does under the balancer's lock
// (event_index::match of a 500-block chain over 64 ranks) every 50 us. A lookup's latency is taken from when
// it was due, not from when it started, so that the lookups held up behind the clear count for as long as
// they waited (a pick arriving then waits as long); the picker's schedule starts afresh just before each
// clear, so that the refill between clears leaves no backlog. Prints, over the lookups due while a clear ran
// (8 clears), the p50, p99 and largest latency, and how long each clear took its caller. On a shared machine
// the latencies include the picker's own waits for a core. Not a test: nothing is asserted.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "dplb/kv/block_index.hpp"
#include "dplb/kv/chain_hash.hpp"
#include "dplb/kv/event_index.hpp"

using namespace dplb::kv;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::size_t ranks = 64;
constexpr std::size_t block_size = 16;
constexpr std::size_t blocks_per_rank = 262'144;
constexpr std::size_t run_blocks = 512;  // blocks per BlockStored event: 512 runs fill a rank
constexpr int clears = 8;
constexpr auto lookup_every = std::chrono::microseconds(50);

std::vector<token_id> run_tokens(std::uint32_t run) {
  std::vector<token_id> tokens(run_blocks * block_size);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<token_id>(run * 1'000'003u + i * 7u + 1u);
  return tokens;
}

// Fills `rank` with runs first_run, first_run + 1, ... until it holds blocks_per_rank blocks.
void fill(event_index& index, std::size_t rank, std::uint32_t first_run, engine_block_key& next_key) {
  for (std::uint32_t run = 0; run < blocks_per_rank / run_blocks; ++run) {
    block_stored event;
    event.token_ids = run_tokens(first_run + run);
    event.block_size = block_size;
    for (std::size_t b = 0; b < run_blocks; ++b) event.block_hashes.push_back(next_key++);
    decode_result batch;
    batch.batch.events.emplace_back(std::move(event));
    index.apply(rank, batch, 0);
  }
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main() {
  event_index index(blocks_per_rank, ranks);
  engine_block_key next_key = 1;
  // Other ranks hold some blocks too, so that the holder lists are shared as in a real deployment.
  for (std::size_t r = 1; r < 4; ++r) fill(index, r, static_cast<std::uint32_t>(r * 100'000), next_key);

  // The picker's prompt: a run rank 1 holds (500 of its blocks match), so every lookup does its full walk.
  std::vector<chain_hash> chain;
  {
    const auto tokens = run_tokens(100'000);
    prompt_chain(std::span<const token_id>(tokens).first(500 * block_size), block_size, chain_seed({}), {}, 1 << 16, chain);
  }

  std::atomic<int> round_started{-1};  // the picker's schedule starts afresh when it changes
  std::atomic<bool> done{false};
  struct sample {
    clock_type::time_point due;
    double us;
  };
  std::vector<sample> samples;  // the picker's thread only, until it is joined
  samples.reserve(1 << 20);
  std::thread picker([&] {
    std::vector<std::uint32_t> matched;
    int round = -1;
    auto due = clock_type::now();
    while (!done.load(std::memory_order_relaxed)) {
      if (const int r = round_started.load(std::memory_order_acquire); r != round) {
        round = r;
        due = clock_type::now();
      }
      while (clock_type::now() < due) {
      }
      index.match(chain, ranks, matched);
      if (samples.size() < samples.capacity()) {
        samples.push_back({due, std::chrono::duration<double, std::micro>(clock_type::now() - due).count()});
      }
      if (matched[1] != 500) std::abort();
      due += lookup_every;
    }
  });

  std::vector<double> clear_ms;
  std::vector<std::pair<clock_type::time_point, clock_type::time_point>> windows;
  all_blocks_cleared cleared;
  decode_result clear_batch;
  clear_batch.batch.events.emplace_back(cleared);
  for (int round = 0; round < clears; ++round) {
    fill(index, 0, static_cast<std::uint32_t>(round * 1'000), next_key);
    if (index.feed(0)->blocks.load() != blocks_per_rank) std::abort();
    round_started.store(round, std::memory_order_release);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the picker is on its schedule
    const auto start = clock_type::now();
    index.apply(0, clear_batch, 0);
    const auto end = clock_type::now();
    windows.emplace_back(start, end);
    clear_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the lookups held up are done
    if (index.feed(0)->blocks.load() != 0) std::abort();
  }
  done.store(true);
  picker.join();
  // The lookups due in the 4 ms before each clear are the baseline: the same picker on the same machine, with
  // nothing else holding the index (what a busy machine's scheduling costs shows in both).
  std::vector<double> during_us;
  std::vector<double> before_us;
  for (const auto& [due, us] : samples) {
    if (std::ranges::any_of(windows, [&](const auto& w) { return due >= w.first && due <= w.second; })) {
      during_us.push_back(us);
    } else if (std::ranges::any_of(windows, [&](const auto& w) {
                 return due < w.first && due >= w.first - std::chrono::milliseconds(4);
               })) {
      before_us.push_back(us);
    }
  }

  std::printf("rank 0: %zu blocks cleared by AllBlocksCleared, %d times; a 500-block lookup over %zu ranks due every %lld us\n",
              blocks_per_rank, clears, ranks, static_cast<long long>(lookup_every.count()));
  std::printf("clear, as its caller waits:  median %8.2f ms  largest %8.2f ms\n", percentile(clear_ms, 0.5),
              percentile(clear_ms, 1.0));
  std::printf("lookups due during a clear (%zu): p50 %8.1f us  p99 %8.1f us  largest %8.1f us\n", during_us.size(),
              percentile(during_us, 0.5), percentile(during_us, 0.99), percentile(during_us, 1.0));
  std::printf("lookups due just before   (%zu): p50 %8.1f us  p99 %8.1f us  largest %8.1f us\n", before_us.size(),
              percentile(before_us, 0.5), percentile(before_us, 0.99), percentile(before_us, 1.0));

  // The same clear without a second thread: how long each of its holds of the index's lock lasts (the
  // retirement, then each slice event_index frees), timed on a block_index as event_index drives it. What a
  // pick can wait for a clear is one of these, when the machine runs the clearing thread meanwhile.
  {
    block_index bare(blocks_per_rank);
    apply_counts counts;
    engine_block_key key = 1;
    for (std::uint32_t run = 0; run < blocks_per_rank / run_blocks; ++run) {
      block_stored event;
      event.token_ids = run_tokens(run);
      event.block_size = block_size;
      for (std::size_t b = 0; b < run_blocks; ++b) event.block_hashes.push_back(key++);
      bare.apply(0, kv_event{std::move(event)}, counts);
    }
    auto start = clock_type::now();
    bare.clear_rank(0);
    const double retire_us = std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
    std::vector<double> slice_us;
    for (bool more = true; more;) {
      start = clock_type::now();
      more = bare.collect(256);
      slice_us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    std::printf("a clear's holds of the lock: retire %.1f us, then %zu slices: p50 %.1f us  p99 %.1f us  largest %.1f us\n",
                retire_us, slice_us.size(), percentile(slice_us, 0.5), percentile(slice_us, 0.99), percentile(slice_us, 1.0));
  }
  return 0;
}
