// The simulated KV cache: the block pool (capacity, LRU eviction, prefix chains) and the scheduler's use
// of it (hits skip exactly the cached blocks, admission waits for room, recompute preemption).
#include <catch2/catch.hpp>
#include <chrono>
#include <numeric>
#include <vector>

#include "batch_scheduler.hpp"
#include "kv_block_pool.hpp"

using namespace dplb::mock::sim;
using namespace std::chrono_literals;

namespace {

std::vector<token_id> tokens(token_id first, std::size_t count) {
  std::vector<token_id> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<token_id> concat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

kv_cache_config small_cache(std::uint32_t blocks) {
  kv_cache_config c;
  c.block_size = 16;
  c.num_blocks = blocks;
  return c;
}

// A scheduler with a small cache, no token budget, and steps that cost only their prefill: the tests
// read step.prefill_tokens, which is exactly what the cache saved or not.
engine_config with_cache(std::uint32_t blocks) {
  engine_config c;
  c.max_num_batched_tokens = 0;
  c.kv = small_cache(blocks);
  return c;
}

// A request's chain as the mock's session builds it: its prompt's tokens, 16 per block.
chain_builder prompt_of(const std::vector<token_id>& t) {
  chain_builder b(16);
  for (const auto token : t) b.add(token);
  return b;
}

// Runs steps until `s` has no work; returns the prompt tokens prefilled in all of them.
std::uint64_t run_to_end(batch_scheduler& s, std::vector<token_event>& out) {
  std::uint64_t prefilled = 0;
  for (int guard = 0; s.has_work() && guard < 10'000; ++guard) {
    prefilled += s.begin_step().prefill_tokens;
    s.end_step(1, out);
  }
  REQUIRE_FALSE(s.has_work());
  return prefilled;
}

}  // namespace

TEST_CASE("chain hashes: full blocks only, each depending on every token before it", "[sim][kv]") {
  const auto a = chain_hashes(tokens(0, 40), 16);
  CHECK(a.size() == 2);  // 40 tokens: 2 full blocks, the last 8 are not hashed
  const auto b = chain_hashes(concat(tokens(0, 32), tokens(1000, 16)), 16);
  REQUIRE(b.size() == 3);
  CHECK(b[0] == a[0]);
  CHECK(b[1] == a[1]);
  auto changed = tokens(0, 32);
  changed[3] = 99;  // one token of the first block: every later hash changes too (the chain)
  const auto c = chain_hashes(changed, 16);
  CHECK(c[0] != a[0]);
  CHECK(c[1] != a[1]);
  CHECK(chain_hashes(tokens(0, 32), 16, 7)[0] != a[0]);  // another seed, another cache
}

TEST_CASE("block pool: allocation takes the least recently freed block, a request's tail first", "[sim][kv]") {
  kv_block_pool pool(small_cache(4));
  CHECK(pool.free_blocks() == 4);
  std::vector<block_id> a;
  std::vector<block_id> b;
  REQUIRE(pool.allocate(2, a));
  REQUIRE(pool.allocate(2, b));
  CHECK(pool.free_blocks() == 0);
  CHECK_FALSE(pool.allocate(1, b));  // nothing taken when there is no room
  CHECK(b.size() == 2);
  const std::vector<block_id> a_blocks = a;
  const std::vector<block_id> b_blocks = b;
  pool.release(a);  // free queue: a[1], a[0]
  pool.release(b);  // then b[1], b[0]
  CHECK(a.empty());
  CHECK(pool.used_blocks() == 0);
  std::vector<block_id> c;
  REQUIRE(pool.allocate(3, c));
  CHECK(c == std::vector<block_id>{a_blocks[1], a_blocks[0], b_blocks[1]});
}

TEST_CASE("block pool: a named block is reused while it lives, and forgotten when reallocated", "[sim][kv]") {
  kv_block_pool pool(small_cache(2));
  const auto chain = chain_hashes(tokens(0, 32), 16);
  std::vector<block_id> a;
  REQUIRE(pool.allocate(2, a));
  pool.name(a[0], chain[0]);
  pool.name(a[1], chain[1]);
  CHECK(pool.cached_prefix(chain) == 2);
  CHECK(pool.free_among_cached(chain, 2) == 0);  // held
  pool.release(a);
  CHECK(pool.cached_prefix(chain) == 2);  // free, still cached
  CHECK(pool.free_among_cached(chain, 2) == 2);
  std::vector<block_id> b;
  pool.take_cached(chain, 1, b);  // a hit takes its block off the free queue
  CHECK(pool.free_blocks() == 1);
  std::vector<block_id> c;
  REQUIRE(pool.allocate(1, c));  // the only free one: the second block of the chain, evicted
  CHECK(pool.cached_prefix(chain) == 1);
  CHECK(pool.cached_blocks() == 1);
}

TEST_CASE("block pool: without prefix caching nothing is ever found", "[sim][kv]") {
  auto config = small_cache(2);
  config.prefix_caching = false;
  kv_block_pool pool(config);
  const auto chain = chain_hashes(tokens(0, 16), 16);
  std::vector<block_id> a;
  REQUIRE(pool.allocate(1, a));
  pool.name(a[0], chain[0]);
  CHECK(pool.cached_prefix(chain) == 0);
}

TEST_CASE("a prefix hit skips exactly the cached blocks", "[sim][kv]") {
  batch_scheduler s(with_cache(64));
  std::vector<token_event> out;
  const auto shared = tokens(0, 32);
  s.submit(1, 40, 1, prompt_of(concat(shared, tokens(500, 8))));
  CHECK(run_to_end(s, out) == 40);  // cold: all of it
  CHECK(s.prefix_queries() == 40);
  CHECK(s.prefix_hits() == 0);

  // Same two leading blocks, then 20 other tokens: 32 cached, 20 prefilled.
  s.submit(2, 52, 1, prompt_of(concat(shared, tokens(900, 20))));
  CHECK(run_to_end(s, out) == 20);
  CHECK(s.prefix_queries() == 40 + 52);
  CHECK(s.prefix_hits() == 32);

  // The very same 32-token prompt: its last token is computed again (it samples the next one), so only
  // the first block comes from the cache.
  s.submit(3, 32, 1, prompt_of(shared));
  CHECK(run_to_end(s, out) == 16);
  CHECK(s.prefix_hits() == 32 + 16);

  // A different first block shares nothing, even with the same later tokens.
  s.submit(4, 32, 1, prompt_of(concat(tokens(7000, 16), tokens(16, 16))));
  CHECK(run_to_end(s, out) == 32);
}

TEST_CASE("a request waits in the queue while the cache has no room for it", "[sim][kv]") {
  batch_scheduler s(with_cache(4));  // 64 tokens
  CHECK(s.fits(48, 16));
  CHECK_FALSE(s.fits(48, 17));
  std::vector<token_event> out;
  s.submit(1, 48, 2);  // 3 blocks now, a 4th for its second token's KV... never: it finishes first
  s.submit(2, 32, 1);  // 2 blocks: only 1 is free
  s.begin_step();
  CHECK(s.running() == 1);
  CHECK(s.waiting() == 1);
  CHECK(s.kv_cache().used_blocks() == 3);
  s.end_step(1, out);  // request 1's first token
  s.begin_step();      // its second (last) token: computes the first's KV in block 4
  CHECK(s.kv_cache().used_blocks() == 4);
  CHECK(s.waiting() == 1);
  s.end_step(1, out);
  CHECK(s.kv_cache().used_blocks() == 0);  // finished: everything free again
  s.begin_step();
  CHECK(s.running() == 1);  // now request 2 fits
  s.end_step(1, out);
  CHECK(out.size() == 3);
  CHECK(s.preemptions() == 0);
}

TEST_CASE("a full cache preempts the last admitted request, which recomputes and still finishes", "[sim][kv]") {
  batch_scheduler s(with_cache(4));  // 64 tokens
  std::vector<token_event> out;
  s.submit(1, 16, 20);  // 1 block, then a second once it has computed 16 + 1 tokens
  s.submit(2, 16, 20);  // same: together they need 4 blocks at token 17, 6 at token 33
  std::uint64_t prefilled = 0;
  std::uint64_t steps = 0;
  while (s.has_work() && steps < 1000) {
    prefilled += s.begin_step().prefill_tokens;
    s.end_step(1, out);
    ++steps;
  }
  REQUIRE_FALSE(s.has_work());
  CHECK(s.preemptions() >= 1);
  // Each produced exactly 20 tokens, and request 1 (admitted first) never lost its place.
  std::vector<unsigned> produced(3, 0);
  for (const auto& t : out) ++produced[t.id];
  CHECK(produced[1] == 20);
  CHECK(produced[2] == 20);
  // Request 2 was preempted with k tokens produced and prefilled its 16 + k tokens again, minus what the
  // cache still had of its prompt (its one prompt block, freed last-block-first, survives the eviction
  // of its decode blocks only if nothing reused it).
  CHECK(prefilled > 32);
  CHECK(s.kv_cache().used_blocks() == 0);
  CHECK(s.kv_tokens() == 0);
  CHECK(s.prompt_tokens_pending() == 0);
  CHECK(s.decode_tokens_pending() == 0);
}

TEST_CASE("a preempted request goes back to the front of the queue, ahead of later arrivals", "[sim][kv]") {
  engine_config c = with_cache(3);  // 48 tokens
  batch_scheduler s(c);
  std::vector<token_event> out;
  s.submit(1, 16, 16);  // needs its second block at its 17th token
  s.submit(2, 16, 16);
  s.begin_step();  // both admitted: 2 blocks
  s.end_step(1, out);
  s.submit(3, 16, 1);  // arrives later; 1 block free, but only after the preempted one is served
  s.begin_step();      // request 1 decodes (16 + 1 tokens: needs block 3); request 2 as well: preempted
  // Request 1 took the last free block, so request 2 (last admitted) went back; nobody is admitted in a
  // step that preempted.
  CHECK(s.preemptions() == 1);
  CHECK(s.running() == 1);
  CHECK(s.waiting() == 2);
  s.end_step(1, out);
  const std::size_t preempted_at = out.size();
  while (s.has_work()) {
    s.begin_step();
    s.end_step(1, out);
  }
  // Request 2 was admitted again before request 3 (arrival order, the preempted first): its first token
  // after the preemption comes before request 3's, which could not jump the queue while 2 had no room.
  std::size_t resumed_2 = out.size();
  std::size_t first_of_3 = out.size();
  for (std::size_t i = preempted_at; i < out.size(); ++i) {
    if (out[i].id == 2 && resumed_2 == out.size()) resumed_2 = i;
    if (out[i].id == 3 && first_of_3 == out.size()) first_of_3 = i;
  }
  REQUIRE(first_of_3 < out.size());
  CHECK(resumed_2 < first_of_3);
}

TEST_CASE("a prefix stays cached after its requests end until the blocks are needed again", "[sim][kv]") {
  batch_scheduler s(with_cache(8));  // 128 tokens
  std::vector<token_event> out;
  const auto prefix = tokens(0, 64);
  s.submit(1, 64, 1, prompt_of(prefix));
  run_to_end(s, out);
  s.submit(2, 64, 1, prompt_of(prefix));
  CHECK(run_to_end(s, out) == 16);  // 3 of 4 blocks cached (the last token is always computed)
  // An unrelated request takes 7 of the 8 blocks. Free blocks go in the order they were freed, each
  // request's last block first, so the chain's first block (freed last) is the one that survives.
  s.submit(3, 112, 1, prompt_of(tokens(5000, 112)));
  run_to_end(s, out);
  s.submit(4, 64, 1, prompt_of(prefix));
  CHECK(run_to_end(s, out) == 48);
  // And after a request that takes all 8, nothing of it is left.
  s.submit(5, 128, 1, prompt_of(tokens(9000, 128)));
  run_to_end(s, out);
  s.submit(6, 64, 1, prompt_of(prefix));
  CHECK(run_to_end(s, out) == 64);
}

TEST_CASE("requests admitted in the same step share what the first one is prefilling", "[sim][kv]") {
  batch_scheduler s(with_cache(64));
  s.submit(1, 64, 1, prompt_of(tokens(0, 64)));
  s.submit(2, 64, 1, prompt_of(tokens(0, 64)));
  // As vLLM names blocks when it schedules them: the second finds 3 of 4 blocks (its last token is
  // computed again) though none was computed when it was admitted.
  CHECK(s.begin_step().prefill_tokens == 64 + 16);
  CHECK(s.prefix_hits() == 48);
}

TEST_CASE("generated tokens fill cached blocks too: a conversation's next turn hits its last answer", "[sim][kv]") {
  batch_scheduler s(with_cache(64));
  std::vector<token_event> out;
  const auto turn1 = tokens(0, 16);
  s.submit(1, 16, 20, prompt_of(turn1));  // 16 + 19 computed tokens: 2 full blocks by the end
  run_to_end(s, out);
  // The next turn sends the history back: the prompt, the answer (20 x "tok"), then a new question.
  auto turn2 = turn1;
  turn2.insert(turn2.end(), 20, generated_token);
  turn2.insert(turn2.end(), {7, 8, 9, 10, 11, 12});
  s.submit(2, turn2.size(), 1, prompt_of(turn2));
  CHECK(run_to_end(s, out) == turn2.size() - 32);
}

TEST_CASE("an aborted request gives back only the blocks nobody else holds", "[sim][kv]") {
  batch_scheduler s(with_cache(16));
  std::vector<token_event> out;
  const auto shared = tokens(0, 48);
  s.submit(1, 64, 10, prompt_of(concat(shared, tokens(100, 16))));  // 4 blocks
  s.begin_step();
  s.end_step(1, out);
  s.submit(2, 64, 10, prompt_of(concat(shared, tokens(200, 16))));  // its 3 leading blocks are request 1's
  s.begin_step();
  s.end_step(1, out);
  // Request 1: its 4 prompt blocks and a 5th for the token it decodes; request 2: its own last block.
  CHECK(s.kv_cache().used_blocks() == 4 + 1 + 1);
  CHECK(s.prefix_hits() == 48);
  REQUIRE(s.abort(1));
  CHECK(s.kv_cache().used_blocks() == 3 + 1);  // the shared 3 stay, held by request 2
  REQUIRE(s.abort(2));
  CHECK(s.kv_cache().used_blocks() == 0);
  CHECK(s.kv_cache().free_blocks() == 16);
  CHECK(s.kv_tokens() == 0);
}

TEST_CASE("a preempted request finds its own blocks in the cache when it is admitted again", "[sim][kv]") {
  batch_scheduler s(with_cache(4));  // 64 tokens
  std::vector<token_event> out;
  s.submit(1, 16, 20, prompt_of(tokens(0, 16)));
  s.submit(2, 16, 20, prompt_of(tokens(500, 16)));
  run_to_end(s, out);
  REQUIRE(s.preemptions() >= 1);
  CHECK(s.prefix_hits() >= 16);  // at least its prompt's block came back
}

TEST_CASE("fits() refuses what the cache cannot hold, whatever max_tokens a client sends", "[sim][kv]") {
  batch_scheduler s(with_cache(4));  // 64 tokens
  CHECK(s.fits(48, 16));
  CHECK_FALSE(s.fits(48, 17));
  CHECK_FALSE(s.fits(1, UINT64_MAX));
  CHECK_FALSE(s.fits(UINT64_MAX, 1));
  CHECK_FALSE(s.fits(UINT64_MAX - 10, UINT64_MAX - 10));
  CHECK(s.fits(0, 63));
}
