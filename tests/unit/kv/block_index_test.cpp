// The KV block index: what each rank holds according to its events, matched by token content. A stored
// chain attracts exactly its prefix; parents link runs across batches; removal and clear take blocks away
// at once; adapters and salts never match each other; other media and KV cache groups are ignored; the
// per-rank bound drops the oldest first; DP ranks are independent.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <vector>

#include "dplb/kv/block_index.hpp"
#include "dplb/kv/kv_event.hpp"
#include "msgpack_writer.hpp"

using namespace dplb::kv;

namespace {

constexpr std::uint32_t block = 4;

// Tokens first, first + 1, ...: `blocks` full blocks.
std::vector<token_id> tokens(std::size_t blocks, token_id first = 100) {
  std::vector<token_id> t(blocks * block);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// BlockStored of `toks` under engine hashes first_key, first_key + 1, ... (integers).
block_stored stored_event(const std::vector<token_id>& toks, std::uint64_t first_key,
                          std::optional<std::uint64_t> parent = std::nullopt) {
  block_stored s;
  for (std::size_t i = 0; i < toks.size() / block; ++i) s.block_hashes.push_back(engine_key_of_int(first_key + i));
  if (parent) s.parent_block_hash = engine_key_of_int(*parent);
  s.token_ids = toks;
  s.block_size = block;
  return s;
}

block_removed removed_event(std::initializer_list<std::uint64_t> keys) {
  block_removed r;
  for (const auto k : keys) r.block_hashes.push_back(engine_key_of_int(k));
  return r;
}

std::vector<chain_hash> chain_of(const std::vector<token_id>& toks, chain_hash seed = chain_seed({}),
                                 std::span<const std::uint64_t> extra = {}) {
  std::vector<chain_hash> out;
  prompt_chain(toks, block, seed, extra, 1 << 20, out);
  return out;
}

std::vector<std::uint32_t> match(const block_index& index, const std::vector<chain_hash>& chain, std::size_t ranks = 4) {
  std::vector<std::uint32_t> m;
  index.match(chain, ranks, m);
  return m;
}

using counts_t = std::vector<std::uint32_t>;

}  // namespace

TEST_CASE("kv index: a stored chain attracts exactly its prefix", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto stored_tokens = tokens(3);
  index.apply(1, kv_event{stored_event(stored_tokens, 10)}, c);
  CHECK(c.applied == 1);
  CHECK(index.blocks(1) == 3);
  CHECK(index.blocks(0) == 0);

  // The same three blocks, then more: rank 1 holds 3 leading blocks.
  auto prompt = stored_tokens;
  const auto more = tokens(2, 900);
  prompt.insert(prompt.end(), more.begin(), more.end());
  CHECK(match(index, chain_of(prompt)) == counts_t{0, 3, 0, 0});
  // A partial trailing block is no block: 2 full blocks and a half.
  auto short_prompt = std::vector<token_id>(stored_tokens.begin(), stored_tokens.begin() + 2 * block + 2);
  CHECK(match(index, chain_of(short_prompt)) == counts_t{0, 2, 0, 0});
  // Same tokens from the second block on, another first block: nothing (the chain carries the prefix).
  auto other_head = stored_tokens;
  other_head[0] = 7;
  CHECK(match(index, chain_of(other_head)) == counts_t{0, 0, 0, 0});
  // A change in the second block: only the first matches.
  auto other_middle = stored_tokens;
  other_middle[block + 1] = 7;
  CHECK(match(index, chain_of(other_middle)) == counts_t{0, 1, 0, 0});
  // An empty prompt matches nothing, and `matched` is sized to the ranks asked for.
  CHECK(match(index, {}, 2) == counts_t{0, 0});
}

TEST_CASE("kv index: a run continues its parent's chain across batches, an unknown parent is not placed", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto all = tokens(5);
  const std::vector<token_id> head(all.begin(), all.begin() + 2 * block);
  const std::vector<token_id> tail(all.begin() + 2 * block, all.end());
  event_batch first;
  first.events.push_back(stored_event(head, 100));  // engine hashes 100, 101
  event_batch second;
  second.events.push_back(stored_event(tail, 102, 101));  // 102..104, parent 101
  index.apply(0, first, c);
  index.apply(0, second, c);
  CHECK(c.applied == 2);
  CHECK(match(index, chain_of(all)) == counts_t{5, 0, 0, 0});

  // The same tail under a parent rank 2 never stored: counted, placed nowhere.
  index.apply(2, kv_event{stored_event(tail, 102, 101)}, c);
  CHECK(c.unplaced == 1);
  CHECK(index.blocks(2) == 0);
  // The tail's tokens alone, as a prompt of their own, match nothing anywhere: they were stored after a head.
  CHECK(match(index, chain_of(tail)) == counts_t{0, 0, 0, 0});
}

TEST_CASE("kv index: BlockRemoved and AllBlocksCleared take blocks away at once", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto t = tokens(4);
  index.apply(0, kv_event{stored_event(t, 1)}, c);  // engine hashes 1..4
  index.apply(1, kv_event{stored_event(t, 1)}, c);
  CHECK(match(index, chain_of(t)) == counts_t{4, 4, 0, 0});

  index.apply(0, kv_event{removed_event({3})}, c);  // the third block
  CHECK(index.blocks(0) == 3);
  CHECK(match(index, chain_of(t)) == counts_t{2, 4, 0, 0});
  index.apply(0, kv_event{removed_event({1, 77})}, c);  // the head, and a hash it never had
  CHECK(match(index, chain_of(t)) == counts_t{0, 4, 0, 0});
  CHECK(index.blocks(0) == 2);

  index.apply(1, kv_event{all_blocks_cleared{}}, c);
  CHECK(index.blocks(1) == 0);
  CHECK(match(index, chain_of(t)) == counts_t{0, 0, 0, 0});
  index.clear_rank(0);
  CHECK(index.blocks(0) == 0);
  // Stored again after the clear: found again.
  index.apply(1, kv_event{stored_event(t, 1)}, c);
  CHECK(match(index, chain_of(t)) == counts_t{0, 4, 0, 0});
}

TEST_CASE("kv index: blocks of another adapter or salt never match", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto t = tokens(2);
  auto lora = stored_event(t, 1);
  lora.lora_name = "adapter-a";
  index.apply(0, kv_event{lora}, c);
  auto salted = stored_event(t, 1);
  const std::array<std::string_view, 1> salt{"salt-1"};
  salted.extra_keys = std::vector<std::uint64_t>{extra_keys_digest(salt), 0};  // vLLM: the salt is in block 0's keys
  index.apply(1, kv_event{salted}, c);
  auto by_id = stored_event(t, 1);
  by_id.lora_id = 3;  // no lora_name (older vLLM): a seed no request produces
  index.apply(2, kv_event{by_id}, c);
  index.apply(3, kv_event{stored_event(t, 1)}, c);

  CHECK(match(index, chain_of(t)) == counts_t{0, 0, 0, 2});
  CHECK(match(index, chain_of(t, chain_seed("adapter-a"))) == counts_t{2, 0, 0, 0});
  CHECK(match(index, chain_of(t, chain_seed("adapter-b"))) == counts_t{0, 0, 0, 0});
  const std::array<std::uint64_t, 1> salted_keys{extra_keys_digest(salt)};
  CHECK(match(index, chain_of(t, chain_seed({}), salted_keys)) == counts_t{0, 2, 0, 0});
  const std::array<std::string_view, 1> other_salt{"salt-2"};
  const std::array<std::uint64_t, 1> other_keys{extra_keys_digest(other_salt)};
  CHECK(match(index, chain_of(t, chain_seed({}), other_keys)) == counts_t{0, 0, 0, 0});
}

TEST_CASE("kv index: extra keys read from an event's msgpack match the digest a request computes", "[kv]") {
  // The event as vLLM writes it: block 0's keys are (LoRA name, salt), block 1's (LoRA name).
  dplb::kv::test::msgpack_writer w;
  w.array(2).float64(1).array(1);
  w.array(10).str("BlockStored").array(2).uint(1).uint(2).nil().uints(tokens(2)).uint(block).nil().str("GPU");
  w.str("adapter-a").array(2).array(2).str("adapter-a").str("salt").array(1).str("adapter-a").uint(0);
  const auto decoded = decode_event_batch(w.bytes());
  REQUIRE(decoded.ok());
  REQUIRE(decoded.batch.events.size() == 1);
  block_index index(100);
  apply_counts c;
  index.apply(2, decoded.batch, c);
  CHECK(c.applied == 1);
  const std::array<std::string_view, 2> first{"adapter-a", "salt"};
  const std::array<std::string_view, 1> rest{"adapter-a"};
  const std::array<std::uint64_t, 2> keys{extra_keys_digest(first), extra_keys_digest(rest)};
  CHECK(match(index, chain_of(tokens(2), chain_seed("adapter-a"), keys)) == counts_t{0, 0, 2, 0});
  CHECK(match(index, chain_of(tokens(2), chain_seed("adapter-a"))) == counts_t{0, 0, 0, 0});
}

TEST_CASE("kv index: other media and KV cache groups are ignored", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto t = tokens(2);
  auto cpu = stored_event(t, 1);
  cpu.medium = "CPU";
  auto sliding = stored_event(t, 1);
  sliding.group_idx = 1;
  index.apply(0, kv_event{cpu}, c);
  index.apply(0, kv_event{sliding}, c);
  CHECK(c.ignored == 2);
  CHECK(index.blocks(0) == 0);

  auto full_attention = stored_event(t, 1);
  full_attention.group_idx = 0;
  full_attention.medium = "gpu";
  index.apply(0, kv_event{full_attention}, c);
  CHECK(index.blocks(0) == 2);
  // A removal from the CPU tier or another group leaves the GPU's full-attention blocks in place.
  auto cpu_removed = removed_event({1, 2});
  cpu_removed.medium = "CPU";
  auto group_removed = removed_event({1, 2});
  group_removed.group_idx = 2;
  index.apply(0, kv_event{cpu_removed}, c);
  index.apply(0, kv_event{group_removed}, c);
  CHECK(c.ignored == 4);
  CHECK(match(index, chain_of(t)) == counts_t{2, 0, 0, 0});
}

TEST_CASE("kv index: the per-rank bound drops the oldest stored first, a run's tail before its head", "[kv]") {
  block_index index(4);
  apply_counts c;
  const auto a = tokens(2, 100);
  const auto b = tokens(2, 200);
  const auto d = tokens(3, 300);
  index.apply(0, kv_event{stored_event(a, 10)}, c);
  index.apply(0, kv_event{stored_event(b, 20)}, c);
  CHECK(index.blocks(0) == 4);
  CHECK(c.dropped_blocks == 0);
  index.apply(0, kv_event{stored_event(d, 30)}, c);  // 3 more: a's 2 blocks and b's tail go
  CHECK(index.blocks(0) == 4);
  CHECK(c.dropped_blocks == 3);
  CHECK(match(index, chain_of(a)) == counts_t{0, 0, 0, 0});
  CHECK(match(index, chain_of(b)) == counts_t{1, 0, 0, 0});
  CHECK(match(index, chain_of(d)) == counts_t{3, 0, 0, 0});
  // Another rank has its own bound.
  index.apply(1, kv_event{stored_event(a, 10)}, c);
  CHECK(match(index, chain_of(a)) == counts_t{0, 2, 0, 0});

  // A run longer than the bound keeps its head.
  block_index small(2);
  small.apply(0, kv_event{stored_event(tokens(5), 1)}, c);
  CHECK(small.blocks(0) == 2);
  CHECK(match(small, chain_of(tokens(5))) == counts_t{2, 0, 0, 0});
  // Bound 0 indexes nothing.
  block_index none(0);
  none.apply(0, kv_event{stored_event(a, 1)}, c);
  CHECK(none.blocks(0) == 0);
}

TEST_CASE("kv index: DP ranks are independent, and a stored hash stored again replaces its block", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto t = tokens(3);
  // The same engine hashes on two ranks (each engine numbers its own blocks).
  index.apply(0, kv_event{stored_event(t, 1)}, c);
  index.apply(3, kv_event{stored_event(std::vector<token_id>(t.begin(), t.begin() + 2 * block), 1)}, c);
  CHECK(match(index, chain_of(t)) == counts_t{3, 0, 0, 2});
  index.apply(3, kv_event{removed_event({1})}, c);
  CHECK(match(index, chain_of(t)) == counts_t{3, 0, 0, 0});
  CHECK(index.blocks(0) == 3);
  // Rank 0 re-stores hash 1 with other tokens: its old first block is gone, the rest no longer chain.
  index.apply(0, kv_event{stored_event(tokens(1, 5000), 1)}, c);
  CHECK(index.blocks(0) == 3);
  CHECK(match(index, chain_of(t)) == counts_t{0, 0, 0, 0});
  CHECK(match(index, chain_of(tokens(1, 5000))) == counts_t{1, 0, 0, 0});
  // Ranks asked for beyond those indexed read 0; ranks past the bound are ignored.
  CHECK(match(index, chain_of(tokens(1, 5000)), 6) == counts_t{1, 0, 0, 0, 0, 0});
  index.apply(block_index::max_ranks, kv_event{stored_event(t, 1)}, c);
  CHECK(index.blocks(block_index::max_ranks) == 0);
}

TEST_CASE("kv index: match allocates nothing once its output has grown", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto t = tokens(8);
  index.apply(2, kv_event{stored_event(t, 1)}, c);
  const auto chain = chain_of(t);
  std::vector<std::uint32_t> m;
  index.match(chain, 4, m);
  const auto* data = m.data();
  for (int i = 0; i < 3; ++i) index.match(chain, 4, m);
  CHECK(m.data() == data);
  CHECK(m == counts_t{0, 0, 8, 0});
  std::vector<chain_hash> out;
  prompt_chain(t, block, chain_seed({}), {}, 1 << 20, out);
  const auto* chain_data = out.data();
  prompt_chain(t, block, chain_seed({}), {}, 3, out);
  CHECK(out.data() == chain_data);
  CHECK(out.size() == 3);
}

TEST_CASE("kv index: a cleared rank's blocks are retired at once and freed by collect(), slice by slice", "[kv]") {
  block_index index(1000);
  apply_counts c;
  const auto t = tokens(6);
  index.apply(0, kv_event{stored_event(t, 1)}, c);
  index.apply(1, kv_event{stored_event(t, 1)}, c);
  index.clear_rank(0);
  // Cleared for every reader before a block is freed: none counted, none matched, the other rank untouched.
  CHECK(index.has_retired());
  CHECK(index.blocks(0) == 0);
  CHECK(match(index, chain_of(t)) == counts_t{0, 6, 0, 0});
  std::vector<block_index::key_map> key_maps;
  index.take_retired_key_maps(key_maps);
  REQUIRE(key_maps.size() == 1);
  CHECK(key_maps[0].size() == 6);
  // Stored again (under the same engine hashes) before the retired blocks are freed: only the new ones count,
  // and a removal takes the new one.
  index.apply(0, kv_event{stored_event(t, 1)}, c);
  CHECK(index.blocks(0) == 6);
  index.apply(0, kv_event{removed_event({4})}, c);
  CHECK(match(index, chain_of(t)) == counts_t{3, 6, 0, 0});
  CHECK(index.collect(4));  // 4 of the 6 retired: more remain
  CHECK(match(index, chain_of(t)) == counts_t{3, 6, 0, 0});
  CHECK_FALSE(index.collect(4));
  CHECK_FALSE(index.has_retired());
  CHECK(match(index, chain_of(t)) == counts_t{3, 6, 0, 0});
  index.apply(0, kv_event{removed_event({1})}, c);
  CHECK(match(index, chain_of(t)) == counts_t{0, 6, 0, 0});
  CHECK(index.blocks(0) == 4);
  // Cleared many times over without collect(): a generation never comes round to a retired block.
  for (int i = 0; i < 3000; ++i) {
    index.apply(2, kv_event{stored_event(t, 1)}, c);
    index.apply(2, kv_event{all_blocks_cleared{}}, c);
  }
  CHECK(match(index, chain_of(t)) == counts_t{0, 6, 0, 0});
  while (index.collect(100)) {
  }
  CHECK(match(index, chain_of(t)) == counts_t{0, 6, 0, 0});
}
