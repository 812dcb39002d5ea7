// Simulated serving's pure core: CUDA-graph padding, the continuous-batching scheduler and the
// lockstep clock. No sockets, no real time: every figure below is exact.

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "batch_scheduler.hpp"
#include "lockstep_clock.hpp"

using namespace dplb::mock::sim;
using namespace std::chrono_literals;

namespace {

// A few ranks and their clocks: one shared clock (lockstep) or one per rank.
struct fixture {
  fixture(const engine_config& c, unsigned ranks, bool lockstep) : config(c) {
    for (unsigned r = 0; r < ranks; ++r) schedulers.push_back(std::make_unique<batch_scheduler>(config));
    if (lockstep) {
      std::vector<batch_scheduler*> all;
      for (auto& s : schedulers) all.push_back(s.get());
      clocks.push_back(std::make_unique<lockstep_clock>(config, all));
    } else {
      for (auto& s : schedulers) {
        clocks.push_back(std::make_unique<lockstep_clock>(config, std::vector<batch_scheduler*>{s.get()}));
      }
    }
  }

  // Starts every idle clock that has work at `now`.
  void kick(sim_time now) {
    for (auto& clock : clocks) clock->begin_step(now);
  }

  // Runs every clock until no work is left: the earliest step end first, the next step begun at once.
  // Returns the time the last step ended; records when each request produced its last token.
  sim_time run(sim_time now = 0ns) {
    kick(now);
    std::vector<token_event> tokens;
    for (;;) {
      lockstep_clock* next = nullptr;
      for (auto& clock : clocks) {
        if (clock->stepping() && (next == nullptr || clock->step_end() < next->step_end()))
          next = clock.get();
      }
      if (next == nullptr) return now;
      now = next->step_end();
      tokens.clear();
      next->end_step(tokens);
      for (const auto& t : tokens) {
        ++produced[t.id];
        if (t.last) finished_at[t.id] = now;
      }
      next->begin_step(now);
    }
  }

  std::uint64_t padded_total() const {
    std::uint64_t sum = 0;
    for (const auto& s : schedulers) sum += s->padded_tokens();
    return sum;
  }
  std::uint64_t real_total() const {
    std::uint64_t sum = 0;
    for (const auto& s : schedulers) sum += s->real_tokens();
    return sum;
  }

  engine_config config;
  std::vector<std::unique_ptr<batch_scheduler>> schedulers;
  std::vector<std::unique_ptr<lockstep_clock>> clocks;
  std::map<request_id, std::uint64_t> produced;
  std::map<request_id, sim_time> finished_at;
};

// Decode-only costs: no prefill cost and no token budget (every prompt prefilled in the step that
// admits it), so that step times are the padded batch alone.
engine_config decode_only() {
  engine_config c;
  c.prefill_per_token = 0ns;
  c.max_num_batched_tokens = 0;
  return c;
}

// A burst at t=0: counts[r] requests to rank r, each `prompt` tokens in and `out` tokens out.
void burst(fixture& f, const std::vector<unsigned>& counts, std::uint64_t prompt, std::uint64_t out) {
  request_id id = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    for (unsigned i = 0; i < counts[r]; ++i) f.schedulers[r]->submit(id++, prompt, out);
  }
}

}  // namespace

TEST_CASE("default capture sizes are vLLM's", "[sim]") {
  const auto sizes = default_capture_sizes(256);
  REQUIRE(sizes.size() == 3 + 31 + 17);  // 1 2 4 | 8..248 by 8 | 256..512 by 16
  CHECK(sizes.front() == 1);
  CHECK(sizes[3] == 8);
  CHECK(sizes[33] == 248);
  CHECK(sizes[34] == 256);
  CHECK(sizes.back() == 512);
  // min(2 * max_num_seqs, 512): H100/H200's default max_num_seqs 1024 captures the same sizes.
  CHECK(default_capture_sizes(1024) == sizes);
  const auto small = default_capture_sizes(64);
  CHECK(small.back() == 128);
  CHECK(small.size() == 3 + 16);
  CHECK(default_capture_sizes(2) == std::vector<std::uint32_t>{1, 2, 4});
  CHECK(default_capture_sizes(1) == std::vector<std::uint32_t>{1, 2});
  CHECK(default_capture_sizes(200).back() == 400);
  CHECK(default_capture_sizes(200)[34 + 8] == 384);
}

TEST_CASE("padding goes to the next capture size", "[sim]") {
  const auto sizes = default_capture_sizes(256);
  CHECK(padded_batch(0, sizes) == 0);
  CHECK(padded_batch(1, sizes) == 1);
  CHECK(padded_batch(3, sizes) == 4);
  CHECK(padded_batch(5, sizes) == 8);
  CHECK(padded_batch(63, sizes) == 64);
  CHECK(padded_batch(64, sizes) == 64);
  CHECK(padded_batch(65, sizes) == 72);
  CHECK(padded_batch(248, sizes) == 248);
  CHECK(padded_batch(249, sizes) == 256);
  CHECK(padded_batch(257, sizes) == 272);
  CHECK(padded_batch(512, sizes) == 512);
  CHECK(padded_batch(513, sizes) == 513);  // above the largest graph: eager, unpadded
  CHECK(padded_batch(7, {1, 2, 4}) == 7);
}

TEST_CASE("step duration is base + per token * padded + prefill", "[sim]") {
  engine_config c;
  CHECK(step_duration(c, 64, 0) == 24'600us);
  CHECK(step_duration(c, 72, 0) == 25'800us);
  CHECK(step_duration(c, 1, 1024) == 15'000us + 150us + 20'480us);
}

TEST_CASE("at most max_num_seqs run, the rest wait in arrival order", "[sim]") {
  engine_config c = decode_only();
  c.max_num_seqs = 4;
  batch_scheduler s(c);
  for (request_id id = 0; id < 10; ++id) s.submit(id, 10, id < 4 ? 2 : 1);
  CHECK(s.waiting() == 10);
  CHECK(s.running() == 0);

  auto step = s.begin_step();
  CHECK(step.batch == 4);
  CHECK(step.prefill_tokens == 40);
  CHECK(s.running() == 4);
  CHECK(s.waiting() == 6);
  std::vector<token_event> out;
  s.end_step(4, out);
  REQUIRE(out.size() == 4);  // first tokens of 0..3, none last (max_tokens 2)
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(out[i].id == i);
    CHECK_FALSE(out[i].last);
  }

  out.clear();
  step = s.begin_step();  // still full: nobody admitted
  CHECK(step.batch == 4);
  CHECK(step.prefill_tokens == 0);
  s.end_step(4, out);
  REQUIRE(out.size() == 4);
  CHECK(out[3].last);
  CHECK(s.running() == 0);

  out.clear();
  step = s.begin_step();  // 4..7 admitted, in order
  CHECK(step.batch == 4);
  s.end_step(4, out);
  REQUIRE(out.size() == 4);
  CHECK(out[0].id == 4);
  CHECK(out[3].id == 7);
  CHECK(out[3].last);
  CHECK(s.waiting() == 2);
  CHECK(s.steps() == 3);
  CHECK(s.real_tokens() == 12);
}

TEST_CASE("chunked prefill fills the token budget after the decodes", "[sim]") {
  engine_config c = decode_only();
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 8;
  batch_scheduler s(c);
  s.submit(1, 3, 3);  // prefilled in the first step
  s.submit(2, 9, 1);  // 5 tokens in the first step, 4 + the sampled token later
  std::vector<token_event> out;

  auto step = s.begin_step();
  CHECK(step.batch == 2);
  CHECK(step.prefill_tokens == 8);
  s.end_step(2, out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].id == 1);

  s.submit(3, 20, 1);
  out.clear();
  step = s.begin_step();  // 1 decodes (1), 2 finishes its prefill (4), 3 gets the 3 left
  CHECK(step.batch == 3);
  CHECK(step.prefill_tokens == 7);
  s.end_step(4, out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].id == 1);
  CHECK(out[1].id == 2);
  CHECK(out[1].last);

  out.clear();
  step = s.begin_step();  // 1 decodes its last, 3 gets 7 more of its 17 left
  CHECK(step.batch == 2);
  CHECK(step.prefill_tokens == 7);
  s.end_step(2, out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].last);
  CHECK(s.running() == 1);
}

TEST_CASE("without a budget a prompt is prefilled whole in its first step", "[sim]") {
  engine_config c = decode_only();
  c.max_num_batched_tokens = 0;
  batch_scheduler s(c);
  s.submit(1, 100'000, 2);
  s.submit(2, 0, 1);  // an empty prompt still takes one position
  const auto step = s.begin_step();
  CHECK(step.batch == 2);
  CHECK(step.prefill_tokens == 100'001);
  std::vector<token_event> out;
  s.end_step(2, out);
  CHECK(out.size() == 2);
}

TEST_CASE("an aborted request leaves the queue or the batch and produces nothing", "[sim]") {
  engine_config c = decode_only();
  c.max_num_seqs = 2;
  batch_scheduler s(c);
  s.submit(1, 1, 5);
  s.submit(2, 1, 5);
  s.submit(3, 1, 5);
  s.begin_step();
  CHECK(s.abort(2));  // in the step in flight
  CHECK(s.abort(3));  // waiting
  CHECK_FALSE(s.abort(3));
  CHECK_FALSE(s.abort(42));
  std::vector<token_event> out;
  s.end_step(2, out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].id == 1);
  CHECK(s.running() == 1);
  CHECK(s.waiting() == 0);
  CHECK(s.real_tokens() == 2);  // the aborted one's work was done all the same
}

TEST_CASE("kv_tokens counts the tokens admitted requests have computed", "[sim]") {
  engine_config c = decode_only();
  c.max_num_seqs = 1;
  c.max_num_batched_tokens = 4;
  batch_scheduler s(c);
  s.submit(1, 6, 2);
  s.submit(2, 3, 1);  // waits: max_num_seqs 1, so it holds no KV yet
  std::vector<token_event> out;
  s.begin_step();
  CHECK(s.kv_tokens() == 0);  // counted when the step ends, as the tokens it computed
  s.end_step(1, out);
  CHECK(s.kv_tokens() == 4);  // the first chunk
  s.begin_step();
  s.end_step(1, out);
  CHECK(s.kv_tokens() == 6);  // the rest of the prompt; the first token is sampled, its KV comes next step
  s.begin_step();
  s.end_step(1, out);  // its last token: finished, its KV freed
  CHECK(s.kv_tokens() == 0);
  s.begin_step();  // request 2 admitted
  s.end_step(1, out);
  CHECK(s.kv_tokens() == 0);  // 3 prefilled + 1 token, and finished at once
  s.submit(3, 2, 5);
  s.begin_step();
  s.end_step(1, out);
  CHECK(s.kv_tokens() == 2);
  s.begin_step();
  s.end_step(1, out);
  CHECK(s.kv_tokens() == 3);  // a decode computes the token sampled the step before
  CHECK(s.abort(3));
  CHECK(s.kv_tokens() == 0);
}

TEST_CASE("the pending tokens are the prompt not yet prefilled and the tokens not yet produced", "[sim]") {
  engine_config c = decode_only();
  c.max_num_seqs = 1;
  c.max_num_batched_tokens = 4;
  batch_scheduler s(c);
  s.submit(1, 6, 2);
  s.submit(2, 3, 1);  // waits behind it: still owed in full
  CHECK(s.prompt_tokens_pending() == 6 + 3);
  CHECK(s.decode_tokens_pending() == 2 + 1);
  std::vector<token_event> out;
  s.begin_step();
  CHECK(s.prompt_tokens_pending() == 9);  // the chunk counts once the step that computes it ends
  s.end_step(1, out);
  CHECK(s.prompt_tokens_pending() == 2 + 3);
  CHECK(s.decode_tokens_pending() == 3);
  s.begin_step();
  s.end_step(1, out);  // the rest of the prompt and the first token
  CHECK(s.prompt_tokens_pending() == 3);
  CHECK(s.decode_tokens_pending() == 1 + 1);
  s.submit(3, 5, 7);
  CHECK(s.abort(2));  // a waiting request leaves with what it was owed
  CHECK(s.prompt_tokens_pending() == 5);
  CHECK(s.decode_tokens_pending() == 1 + 7);
  CHECK(s.abort(1));  // and so does a running one
  CHECK(s.prompt_tokens_pending() == 5);
  CHECK(s.decode_tokens_pending() == 7);
  s.begin_step();
  s.end_step(1, out);
  s.begin_step();
  s.end_step(1, out);
  CHECK(s.prompt_tokens_pending() == 0);
  CHECK(s.decode_tokens_pending() == 6);
}

TEST_CASE("a lockstep step takes the slowest rank's padded batch, idle ranks run a dummy", "[sim]") {
  const engine_config c = decode_only();
  fixture f(c, 4, true);
  burst(f, {10, 3, 0, 0}, 1, 1);
  auto& clock = *f.clocks[0];
  REQUIRE(clock.begin_step(1s));
  CHECK(clock.padded() == 16);  // max(padded(10)=16, padded(3)=4, dummy 1, dummy 1)
  CHECK(clock.step_end() == 1s + step_duration(c, 16, 0));
  CHECK_FALSE(clock.begin_step(1s));  // one step at a time
  std::vector<token_event> out;
  clock.end_step(out);
  CHECK(out.size() == 13);
  for (const auto& s : f.schedulers) {
    CHECK(s->steps() == 1);
    CHECK(s->padded_tokens() == 16);  // every rank, the idle ones too, ran 16
    CHECK(s->even_padded_tokens() == 4);  // 13 sequences split evenly: 4 at most on a rank, padded(4) = 4
  }
  CHECK(f.schedulers[0]->real_tokens() == 10);
  CHECK(f.schedulers[2]->real_tokens() == 0);
  CHECK_FALSE(clock.begin_step(2s));  // nothing left anywhere: the whole group rests
}

TEST_CASE("the slowest prefill sets a lockstep step's length", "[sim]") {
  engine_config c;  // with prefill costs
  c.max_num_batched_tokens = 0;
  fixture f(c, 2, true);
  f.schedulers[0]->submit(1, 100, 1);
  f.schedulers[1]->submit(2, 1000, 1);
  auto& clock = *f.clocks[0];
  REQUIRE(clock.begin_step(0ns));
  CHECK(clock.step_end() == c.step_base + c.step_per_token * 1 + c.prefill_per_token * 1000);
}

TEST_CASE("without lockstep each rank steps on its own clock", "[sim]") {
  const engine_config c = decode_only();
  fixture f(c, 2, false);
  burst(f, {65, 1}, 1, 3);
  const auto end = f.run();
  // Rank 0: 3 steps at padded 72; rank 1: 3 steps at padded 1, and no dummy steps.
  CHECK(end == 3 * step_duration(c, 72, 0));
  CHECK(f.finished_at[65] == 3 * step_duration(c, 1, 0));
  CHECK(f.schedulers[0]->padded_tokens() == 3 * 72);
  CHECK(f.schedulers[1]->padded_tokens() == 3 * 1);
  CHECK(f.schedulers[1]->steps() == 3);
}

// The claim dplb exists for (README.md, "Why it matters"): 256 requests over 4
// lockstep ranks, 128 output tokens each. Spread 64/64/64/64, every step is 64 a rank; spread
// 65/64/64/63, every rank pads to 72 every step: 12.5% more padded work and a longer makespan.
TEST_CASE("a 65/64/64/63 burst costs 12.5% more padded work than 64/64/64/64", "[sim]") {
  static constexpr std::uint64_t out_tokens = 128;
  const auto run = [](const engine_config& c, const std::vector<unsigned>& spread) {
    fixture f(c, 4, true);
    burst(f, spread, 1024, out_tokens);
    const auto makespan = f.run();
    REQUIRE(f.produced.size() == 256);
    for (const auto& [id, n] : f.produced) REQUIRE(n == out_tokens);
    return std::pair{makespan, std::pair{f.padded_total(), f.real_total()}};
  };

  SECTION("decode costs only: every step is 64 or 72 a rank") {
    const engine_config c = decode_only();
    const auto [even_makespan, even_work] = run(c, {64, 64, 64, 64});
    const auto [skew_makespan, skew_work] = run(c, {65, 64, 64, 63});
    CHECK(even_work.first == 4 * 64 * out_tokens);  // 32768
    CHECK(skew_work.first == 4 * 72 * out_tokens);  // 36864 = 32768 * 9 / 8
    CHECK(even_work.second == 256 * out_tokens);    // the real work is the same
    CHECK(skew_work.second == 256 * out_tokens);
    CHECK(skew_work.first * 8 == even_work.first * 9);
    // 128 steps of 15 ms + 0.15 ms * padded: 3.1488 s against 3.3024 s (+4.88%: the fixed step
    // cost does not grow with the batch).
    CHECK(even_makespan == 128 * 24'600us);
    CHECK(skew_makespan == 128 * 25'800us);
  }

  SECTION("per-token costs only: the makespan grows by the same 12.5%") {
    engine_config c = decode_only();
    c.step_base = 0ns;
    const auto [even_makespan, even_work] = run(c, {64, 64, 64, 64});
    const auto [skew_makespan, skew_work] = run(c, {65, 64, 64, 63});
    CHECK(even_makespan == 128 * 64 * 150us);
    CHECK(skew_makespan * 8 == even_makespan * 9);
  }

  SECTION("default costs, chunked prefill of 1024-token prompts") {
    const engine_config c;  // 8192-token budget: 8 whole prompts a step, then decodes beside the chunks
    const auto [even_makespan, even_work] = run(c, {64, 64, 64, 64});
    const auto [skew_makespan, skew_work] = run(c, {65, 64, 64, 63});
    // Figures from an independent model of the same rules (a few lines of Python, kept out of the
    // tree). Prefill spreads the requests' start over 9 steps, so some steps are not at 64/72; still
    // +11.8% padded work, and +3.6% makespan (prefill and the fixed step cost do not grow with it).
    CHECK(even_makespan == 4'586'870us);
    CHECK(skew_makespan == 4'752'700us);
    CHECK(even_work.first == 32'964);
    CHECK(skew_work.first == 36'840);
    CHECK(even_work.second == 32'796);  // requests scheduled, summed over steps: chunks count once each
    CHECK(skew_work.second == 32'795);
  }
}

TEST_CASE("a remote-prefilled request takes its prompt's blocks but computes only its last token", "[sim][pd]") {
  engine_config c;  // with prefill costs and the 8192-token budget
  c.kv.block_size = 16;
  batch_scheduler s(c);
  s.submit(1, 1000, 3, chain_builder(), /*remote_prefilled=*/true);
  CHECK(s.prompt_tokens_pending() == 1);  // what is left to compute: the last prompt token
  CHECK(s.decode_tokens_pending() == 3);
  const auto step = s.begin_step();
  CHECK(step.batch == 1);
  CHECK(step.prefill_tokens == 1);
  CHECK(s.kv_cache().used_blocks() == 63);  // ceil(1000 / 16): the pulled KV has blocks of its own
  std::vector<token_event> out;
  s.end_step(1, out);
  REQUIRE(out.size() == 1);  // the first token at the end of the first step
  CHECK(s.kv_tokens() == 1000);
  CHECK(s.prompt_tokens_pending() == 0);
  s.begin_step();
  s.end_step(1, out);
  s.begin_step();
  s.end_step(1, out);
  REQUIRE(out.size() == 3);
  CHECK(out[2].last);
  CHECK(s.kv_tokens() == 0);
  CHECK(s.kv_cache().used_blocks() == 0);
  CHECK(s.prefix_hits() == 0);  // pulled, not found in the cache
}

TEST_CASE("a remote-prefilled request's first step costs a decode, a local one its whole prefill", "[sim][pd]") {
  engine_config c;
  c.max_num_batched_tokens = 0;
  fixture remote(c, 1, true);
  remote.schedulers[0]->submit(1, 4000, 2, chain_builder(), true);
  REQUIRE(remote.clocks[0]->begin_step(0ns));
  CHECK(remote.clocks[0]->step_end() == step_duration(c, 1, 1));
  fixture local(c, 1, true);
  local.schedulers[0]->submit(1, 4000, 2);
  REQUIRE(local.clocks[0]->begin_step(0ns));
  CHECK(local.clocks[0]->step_end() == step_duration(c, 1, 4000));
}

TEST_CASE("a remote-prefilled request aborted while waiting or running leaves nothing behind", "[sim][pd]") {
  engine_config c = decode_only();
  c.max_num_seqs = 1;
  batch_scheduler s(c);
  s.submit(1, 100, 5, chain_builder(), true);
  s.submit(2, 100, 5, chain_builder(), true);  // waits: max_num_seqs 1
  std::vector<token_event> out;
  s.begin_step();
  s.end_step(1, out);
  CHECK(s.kv_cache().used_blocks() == 7);
  CHECK(s.abort(2));
  CHECK(s.abort(1));
  CHECK(s.kv_cache().used_blocks() == 0);
  CHECK(s.kv_tokens() == 0);
  CHECK(s.prompt_tokens_pending() == 0);
  CHECK(s.decode_tokens_pending() == 0);
  CHECK_FALSE(s.has_work());
}

// The decode pool of a P/D deployment: 256 pulled requests over 4 lockstep decode ranks. Split 64/64/64/64
// every step runs 64 a rank and nothing is padded; 65/64/64/63 pads every rank to 72, as for co-located
// engines: the padding accounting covers remote-prefilled requests alike.
TEST_CASE("a remote-prefilled burst on 4 lockstep decode ranks pads only when split unevenly", "[sim][pd]") {
  static constexpr std::uint64_t out_tokens = 32;
  const auto run = [](const std::vector<unsigned>& spread) {
    const engine_config c;  // default costs: a local prefill of these prompts would cost 2048 x 20 us a step
    fixture f(c, 4, true);
    request_id id = 0;
    for (std::size_t r = 0; r < spread.size(); ++r) {
      for (unsigned i = 0; i < spread[r]; ++i) f.schedulers[r]->submit(id++, 2048, out_tokens, chain_builder(), true);
    }
    const auto makespan = f.run();
    REQUIRE(f.produced.size() == 256);
    return std::tuple{makespan, f.padded_total(), f.real_total()};
  };
  const auto [even_makespan, even_padded, even_real] = run({64, 64, 64, 64});
  const auto [skew_makespan, skew_padded, skew_real] = run({65, 64, 64, 63});
  CHECK(even_padded == even_real);  // padded/real 1.000
  CHECK(even_real == 256 * out_tokens);
  CHECK(skew_real == 256 * out_tokens);
  CHECK(skew_padded == 4 * 72 * out_tokens);
  // No prefill but the last prompt token of each (64 in the first step): 32 steps of 15 ms + 64 x 0.15 ms,
  // plus 64 x 20 us once.
  CHECK(even_makespan == 32 * 24'600us + 64 * 20us);
}

TEST_CASE("a held request's blocks stay allocated once it finished, until released", "[sim][pd]") {
  engine_config c = decode_only();
  batch_scheduler s(c);
  s.submit(1, 40, 1, chain_builder(), false, /*hold=*/true);
  s.submit(2, 40, 1);
  std::vector<token_event> out;
  s.begin_step();
  s.end_step(2, out);
  REQUIRE(out.size() == 2);
  CHECK_FALSE(s.has_work());
  CHECK(s.held_requests() == 1);
  CHECK(s.kv_cache().used_blocks() == 3);  // request 1's ceil(40 / 16); request 2's are free
  CHECK(s.kv_tokens() == 0);               // held, not running
  CHECK_FALSE(s.release_held(2));          // never held
  CHECK(s.release_held(1));
  CHECK_FALSE(s.release_held(1));  // once
  CHECK(s.kv_cache().used_blocks() == 0);
  CHECK(s.held_requests() == 0);
}

TEST_CASE("a held request aborted before it finished frees its blocks and holds nothing", "[sim][pd]") {
  engine_config c = decode_only();
  batch_scheduler s(c);
  s.submit(1, 40, 3, chain_builder(), false, true);
  std::vector<token_event> out;
  s.begin_step();
  s.end_step(1, out);
  CHECK(s.abort(1));
  CHECK(s.held_requests() == 0);
  CHECK(s.kv_cache().used_blocks() == 0);
}
