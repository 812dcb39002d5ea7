// libFuzzer target for the KV-cache event decoder, dplb::kv::decode_event_batch (a ZMQ message's payload
// from an engine's publisher is network input like any other), and for the block index fed its batches.
// Checks, for every input:
//  - the decoder's contract: a refused payload yields an error and nothing else; a read one respects every
//    bound (events per batch, hashes and tokens per event, string lengths), every BlockStored has
//    block_size ids per block hash in [1, max_block_size] and one extra-keys digest per block when it has
//    any; decoding is deterministic (twice, the same events);
//  - the index after each event: no rank above its bound; AllBlocksCleared empties the rank; a BlockStored
//    that starts a prompt (no parent), for the GPU and group 0, with distinct block hashes and no more blocks
//    than the bound, is matched in full by the prompt's own chain, computed as a request computes it.
// Any difference traps with a description.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <unordered_set>
#include <vector>

#include "dplb/kv/block_index.hpp"
#include "dplb/kv/kv_event.hpp"

namespace {

using namespace dplb::kv;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_kv_events: %s\n", what);
  __builtin_trap();
}

constexpr std::size_t index_blocks = 64;
constexpr std::size_t ranks = 4;

void check_decoded(const decode_result& r) {
  if (!r.ok()) {
    if (!r.batch.events.empty() || r.skipped_events() != 0 || !r.first_skip_reason.empty()) fail("a refused payload kept something");
    return;
  }
  if ((r.skipped_events() == 0) != r.first_skip_reason.empty()) fail("skipped events without a reason, or a reason without one");
  if (r.batch.events.size() > max_events_per_batch) fail("more events than max_events_per_batch");
  for (const kv_event& e : r.batch.events) {
    if (const auto* s = std::get_if<block_stored>(&e)) {
      if (s->block_hashes.size() > max_hashes_per_event) fail("more hashes than max_hashes_per_event");
      if (s->token_ids.size() > max_tokens_per_event) fail("more tokens than max_tokens_per_event");
      if (s->block_size < 1 || s->block_size > max_block_size) fail("block_size out of range");
      if (s->token_ids.size() != s->block_hashes.size() * s->block_size) fail("token_ids not block_size per block");
      if (s->extra_keys && s->extra_keys->size() != s->block_hashes.size()) fail("extra_keys not one per block");
      if (s->medium.size() > max_string_bytes || (s->lora_name && s->lora_name->size() > max_string_bytes))
        fail("a string beyond max_string_bytes");
    } else if (const auto* d = std::get_if<block_removed>(&e)) {
      if (d->block_hashes.size() > max_hashes_per_event) fail("more hashes than max_hashes_per_event");
      if (d->medium.size() > max_string_bytes) fail("a string beyond max_string_bytes");
    }
  }
}

bool indexed(const block_stored& s) {
  return (s.medium == "GPU") && (!s.group_idx || *s.group_idx == 0);
}

bool distinct(const std::vector<engine_block_key>& keys) {
  std::unordered_set<engine_block_key> seen(keys.begin(), keys.end());
  return seen.size() == keys.size();
}

void check_index(const event_batch& batch) {
  block_index index(index_blocks);
  apply_counts counts;
  const std::size_t rank = batch.dp_rank ? static_cast<std::size_t>(*batch.dp_rank) % ranks : 0;
  std::vector<chain_hash> chain;
  std::vector<std::uint32_t> matched;
  for (const kv_event& e : batch.events) {
    index.apply(rank, e, counts);
    for (std::size_t r = 0; r < ranks; ++r)
      if (index.blocks(r) > index_blocks) fail("a rank above its bound");
    if (std::holds_alternative<all_blocks_cleared>(e) && index.blocks(rank) != 0) fail("AllBlocksCleared left blocks");
    const auto* s = std::get_if<block_stored>(&e);
    if (!s || s->parent_block_hash || !indexed(*s) || s->block_hashes.empty() || s->block_hashes.size() > index_blocks ||
        !distinct(s->block_hashes))
      continue;
    const chain_hash seed = s->lora_name ? chain_seed(*s->lora_name) : s->lora_id ? lora_seed_of_id(*s->lora_id) : chain_seed({});
    const std::span<const std::uint64_t> extra = s->extra_keys ? std::span<const std::uint64_t>(*s->extra_keys)
                                                               : std::span<const std::uint64_t>();
    prompt_chain(s->token_ids, s->block_size, seed, extra, max_hashes_per_event, chain);
    index.match(chain, ranks, matched);
    if (matched[rank] != s->block_hashes.size()) fail("a prompt's stored blocks do not match its own chain");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto payload = std::as_bytes(std::span(data, size));
  const decode_result r = decode_event_batch(payload);
  check_decoded(r);
  const decode_result again = decode_event_batch(payload);
  if (again.ok() != r.ok() || again.batch.events.size() != r.batch.events.size() ||
      again.skipped_events() != r.skipped_events())
    fail("decoding is not deterministic");
  if (r.ok()) check_index(r.batch);
  return 0;
}
