// What a precise prefix-aware pick costs apart from the network: an 8,000-token prompt's chain hashed (dplb's
// own XXH3 chain over 16-token blocks, as the engines' KV-cache events are indexed) and matched against a
// block_index holding about 1,000,000 blocks over 64 ranks, the shape of issue 20's microbenchmark, to set
// beside the 1.7-3.1 µs per index lookup NVIDIA Dynamo publishes. Prints µs per operation (the median of 7
// rounds). Not a test: nothing is asserted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "median_time.hpp"
#include "dplb/kv/block_index.hpp"
#include "dplb/kv/chain_hash.hpp"

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
  block_index index(prompts_per_rank * (prompt_tokens / block_size));
  apply_counts counts;
  engine_block_key next_key = 1;
  // Each rank stores whole prompts as one BlockStored event each, as an engine does after a prefill.
  for (std::size_t r = 0; r < ranks; ++r) {
    for (std::size_t p = 0; p < prompts_per_rank; ++p) {
      block_stored event;
      event.token_ids = prompt(static_cast<std::uint32_t>(r * prompts_per_rank + p));
      event.block_size = block_size;
      for (std::size_t b = 0; b < prompt_tokens / block_size; ++b) event.block_hashes.push_back(next_key++);
      index.apply(r, kv_event{std::move(event)}, counts);
    }
  }
  std::size_t indexed = 0;
  for (std::size_t r = 0; r < ranks; ++r) indexed += index.blocks(r);

  // The request: the prompt rank 17 holds whole (a hit of 500 blocks), and one nobody holds (a miss).
  const auto hit = prompt(17 * prompts_per_rank + 5);
  const auto miss = prompt(1'000'000);
  std::vector<chain_hash> chain;
  std::vector<std::uint32_t> matched;
  const auto seed = chain_seed("");
  const double hash_only = median_per_op<std::micro>(2000, [&](int) {
    prompt_chain(hit, block_size, seed, {}, 1024, chain);
    sink = sink + chain.back();
  });
  const double pick_hit = median_per_op<std::micro>(2000, [&](int) {
    prompt_chain(hit, block_size, seed, {}, 1024, chain);
    index.match(chain, ranks, matched);
    sink = sink + matched[17];
  });
  const double pick_miss = median_per_op<std::micro>(2000, [&](int) {
    prompt_chain(miss, block_size, seed, {}, 1024, chain);
    index.match(chain, ranks, matched);
    sink = sink + matched[0];
  });
  prompt_chain(hit, block_size, seed, {}, 1024, chain);
  index.match(chain, ranks, matched);
  std::printf("%zu blocks indexed over %zu ranks (%zu stored events); an %zu-token prompt is %zu blocks; rank 17 "
              "matches %u of them\n\n",
              indexed, ranks, counts.applied, prompt_tokens, chain.size(), matched[17]);
  std::printf("| operation | µs |\n|---|---:|\n");
  std::printf("| hash the prompt's chain (%zu blocks) | %.2f |\n", chain.size(), hash_only);
  std::printf("| hash + match, the prompt held whole by one rank | %.2f |\n", pick_hit);
  std::printf("| hash + match, a prompt no rank holds | %.2f |\n", pick_miss);
  std::printf("| match alone (hit), by difference | %.2f |\n", pick_hit - hash_only);
  return 0;
}
