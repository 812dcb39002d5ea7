// What a precise prefix-aware pick costs apart from the network: an 8,000-token prompt's chain hashed (dplb's
// own XXH3 chain over 16-token blocks, as the engines' KV-cache events are indexed: kv::request_chain) and the
// pick itself (prefix_aware::choose over 64 ranks, matching under the shared index's lock) against an index
// holding about 1,000,000 blocks over 64 ranks, the shape of issue 20's microbenchmark, to set beside the
// 1.7-3.1 µs per index lookup NVIDIA Dynamo publishes. Prints µs per operation (the median of 7 rounds). Not
// a test: nothing is asserted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "median_time.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/kv/chain_hash.hpp"
#include "dplb/kv/event_index.hpp"

using namespace dplb::kv;
using dplb::bench::median_per_op;

namespace {

constexpr std::size_t ranks = 64;
constexpr std::size_t block_size = 16;
constexpr std::size_t prompt_tokens = 8000;  // 500 blocks
constexpr std::size_t prompts_per_rank = 31;  // 31 x 500 x 64 = 992,000 blocks

// A prompt's token ids, different for each (group, position): groups share nothing.
std::vector<token_id> prompt(std::uint32_t group) {
  std::vector<token_id> tokens(prompt_tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<token_id>(group * 100'003u + i * 7u + 1u);
  return tokens;
}

volatile std::uint64_t sink = 0;

}  // namespace

int main() {
  event_index index(prompts_per_rank * (prompt_tokens / block_size), ranks);
  engine_block_key next_key = 1;
  std::size_t stored = 0;
  // Each rank stores whole prompts as one BlockStored event each, as an engine does after a prefill.
  for (std::size_t r = 0; r < ranks; ++r) {
    index.set_configured(r, true);
    for (std::size_t p = 0; p < prompts_per_rank; ++p) {
      block_stored event;
      event.token_ids = prompt(static_cast<std::uint32_t>(r * prompts_per_rank + p));
      event.block_size = block_size;
      for (std::size_t b = 0; b < prompt_tokens / block_size; ++b) event.block_hashes.push_back(next_key++);
      decode_result batch;
      batch.batch.events.emplace_back(std::move(event));
      index.apply(r, batch, 0);
      ++stored;
    }
  }
  std::size_t indexed = 0;
  for (std::size_t r = 0; r < ranks; ++r) indexed += index.feed(r)->blocks.load();

  dplb::balancer::prefix_aware policy({.load_bound = 1.25, .min_match_blocks = 1, .index_blocks_per_rank = 1024,
                                       .events = &index, .block_size = block_size, .event_min_match_blocks = 4},
                                      nullptr);
  std::vector<dplb::balancer::rank_view> views(ranks);
  // The request: the prompt rank 17 holds whole (a hit of 500 blocks), and one nobody holds (a miss).
  const auto hit = prompt(17 * prompts_per_rank + 5);
  const auto miss = prompt(1'000'000);
  std::vector<chain_hash> chain;
  std::vector<std::uint32_t> matched;
  const double hash_only = median_per_op<std::micro>(2000, [&](int) {
    request_chain(hit, block_size, {}, {}, 1 << 16, chain);
    sink = sink + chain.back();
  });
  const auto pick = [&](const std::vector<token_id>& tokens) {
    request_chain(tokens, block_size, {}, {}, 1 << 16, chain);
    dplb::balancer::pick_context request;
    request.kv_chain = chain;
    return *policy.choose(request, views);
  };
  std::size_t hit_rank = 0;
  const double pick_hit = median_per_op<std::micro>(2000, [&](int) { sink = sink + (hit_rank = pick(hit)); });
  const double pick_miss = median_per_op<std::micro>(2000, [&](int) { sink = sink + pick(miss); });
  request_chain(hit, block_size, {}, {}, 1 << 16, chain);
  const double lookup_hit = median_per_op<std::micro>(2000, [&](int) {
    index.match(chain, ranks, matched);
    sink = sink + matched[17];
  });
  index.match(chain, ranks, matched);
  std::printf("%zu blocks indexed over %zu ranks (%zu stored events); an %zu-token prompt is %zu blocks; rank 17 "
              "matches %u of them, and the pick chose rank %zu\n\n",
              indexed, ranks, stored, prompt_tokens, chain.size(), matched[17], hit_rank);
  std::printf("| operation | µs |\n|---|---:|\n");
  std::printf("| hash the prompt's chain (%zu blocks) | %.2f |\n", chain.size(), hash_only);
  std::printf("| hash + pick (64 ranks), the prompt held whole by one rank | %.2f |\n", pick_hit);
  std::printf("| hash + pick (64 ranks), a prompt no rank holds | %.2f |\n", pick_miss);
  std::printf("| the index lookup alone (hit, under the shared index's lock) | %.2f |\n", lookup_hit);
  return 0;
}
