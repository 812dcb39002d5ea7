#pragma once
// Simulated serving, the pure part: one DP rank's continuous-batching scheduler, shaped after vLLM's V1
// scheduler, and the cost model of one engine step. No sockets, no clocks: the caller says when a step
// begins and ends (see lockstep_clock.hpp), so that every outcome is deterministic and unit-testable.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv_block_pool.hpp"

namespace dplb::mock::sim {

using request_id = std::uint64_t;
// Simulated time, counted from the start of the simulation. Durations in the cost model are
// simulated too; the I/O side divides them by --time-scale to get wall time.
using sim_time = std::chrono::nanoseconds;
using sim_duration = std::chrono::nanoseconds;

// vLLM's default CUDA-graph capture sizes for `max_num_seqs`: 1, 2, 4, then every 8 from 8 to 248,
// then every 16 from 256, all up to min(2 * max_num_seqs, 512) (vLLM's set_cudagraph_sizes).
std::vector<std::uint32_t> default_capture_sizes(std::uint32_t max_num_seqs);

// The batch a step really runs for `n` sequences: the smallest capture size >= n, or n itself when n
// is above the largest (vLLM then runs without a CUDA graph, unpadded). `sizes` ascending; padded(0) = 0.
std::uint32_t padded_batch(std::uint32_t n, const std::vector<std::uint32_t>& sizes);

// The engine's shape. Defaults: see mock_options.hpp (the command line documents them).
struct engine_config {
  std::uint32_t max_num_seqs = 256;  // requests running at once (vLLM --max-num-seqs)
  // Token budget of one step (vLLM --max-num-batched-tokens): decodes take 1 token each, prompts are
  // prefilled in chunks that fill the rest (chunked prefill). 0 = no budget: a prompt is prefilled
  // whole in the step that admits it. Else >= max_num_seqs.
  std::uint32_t max_num_batched_tokens = 8192;
  std::vector<std::uint32_t> capture_sizes = default_capture_sizes(256);  // ascending, no duplicates
  sim_duration step_base = std::chrono::microseconds(15'000);      // fixed cost of any step, dummy ones too
  sim_duration step_per_token = std::chrono::microseconds(150);    // per sequence of the padded batch
  sim_duration prefill_per_token = std::chrono::microseconds(20);  // per prompt token prefilled
  kv_cache_config kv;  // the KV cache's blocks, and whether prompts share them (prefix caching)
};

// What one rank runs in one step.
struct rank_step {
  std::uint32_t batch = 0;           // requests scheduled (decoding, or prefilling a chunk); 0 = idle
  std::uint64_t prefill_tokens = 0;  // prompt tokens prefilled in the step
};

// A token produced at the end of a step.
struct token_event {
  request_id id = 0;
  bool last = false;  // the request's max_tokens-th token: it has finished and left the scheduler
};

// One rank's queue and running batch. Not thread-safe; every call is O(running) at most, except
// abort() of a waiting request (O(waiting)).
//
// Each step: every running request is scheduled (a decode takes 1 token of the budget, an unfinished
// prefill the next chunk), then waiting requests are admitted in arrival order while fewer than
// max_num_seqs run and budget is left, each with its first chunk. A request whose prefill completes in
// a step produces its first token at the end of that step; every later step produces one more. After
// max_tokens tokens (ignore_eos: always exactly max_tokens) it leaves.
//
// The KV cache (vLLM V1's KVCacheManager, simplified to one attention type): a request holds the blocks
// of the tokens it has computed and is computing. Admission first reuses the longest cached chain of its
// prompt's blocks (prefix caching: those tokens are not prefilled again; at least the last prompt token
// always is, as vLLM recomputes it to sample), then needs fresh blocks for the chunk it is scheduled; when
// they are not free, admission stops (arrival order is kept). A running request that needs a block when
// none is free preempts the last admitted request (vLLM's recompute preemption: its blocks are freed, it
// goes back to the front of the queue and will prefill its prompt and the tokens it produced again, at
// which point the cache may give much of it back), itself if it is the last.
class batch_scheduler {
 public:
  explicit batch_scheduler(engine_config config) : config_(std::move(config)), kv_(config_.kv) {}

  // Queues a request; ids are unique among the requests the scheduler holds. prompt_tokens 0 counts
  // as 1 (the step that samples the first token processes one position at least); max_tokens >= 1.
  // `chain`: the prompt's tokens fed to a chain_builder of the cache's block size (a default one if the
  // request shares nothing); the scheduler adds each generated token (generated_token) to it.
  // The request must fit the cache on its own (fits()), or it would preempt itself for ever.
  // `remote_prefilled` (a decode engine's request, --kv-role decode): the prompt's KV was computed by a
  // prefill engine and pulled; at admission the request takes blocks for the whole prompt but computes only
  // its last token (vLLM's NixlConnector hands over all but the last prompt token, which the decode engine
  // recomputes to sample), so its first step is a decode-sized one. A preempted one recomputes everything.
  // `hold` (a prefill engine's leg 1, --kv-role prefill): once finished, the request's blocks stay allocated
  // (neither free nor reusable) until release_held(id), as NixlConnector keeps them for the decode engine's
  // read (vLLM's delayed freeing of a remote-decode request's blocks).
  void submit(request_id id, std::uint64_t prompt_tokens, std::uint64_t max_tokens,
              chain_builder chain = chain_builder(), bool remote_prefilled = false, bool hold = false);

  // Frees the blocks a finished `hold` request kept (they stay cached, as any freed block); false if the
  // id holds none (never held, released already, or not finished: abort() frees a running one).
  bool release_held(request_id id);
  std::size_t held_requests() const { return held_.size(); }

  // Whether a request of this size fits the whole KV cache (vLLM refuses a longer context at its door).
  // Without overflow, whatever a client sends as max_tokens.
  bool fits(std::uint64_t prompt_tokens, std::uint64_t max_tokens) const {
    const std::uint64_t capacity = std::uint64_t{config_.kv.num_blocks} * config_.kv.block_size;
    return max_tokens <= capacity && std::max<std::uint64_t>(prompt_tokens, 1) <= capacity - max_tokens;
  }

  // Removes a waiting or running request (the client went away). A request in the step in flight
  // produces nothing at its end. False if the id is not held (finished or never submitted).
  bool abort(request_id id);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  bool stepping() const { return stepping_; }
  std::size_t running() const { return running_.size(); }  // admitted (prefilling or decoding)
  std::size_t waiting() const { return waiting_.size(); }

  // Begins a step: admits and schedules as described above. Must not be stepping.
  rank_step begin_step();

  // Ends the step in flight: appends one token_event per request that produced a token, in admission
  // order, and removes finished requests. `padded` is the batch the rank really ran (its own padded
  // batch, or the lockstep group's) and is only counted.
  void end_step(std::uint32_t padded, std::vector<token_event>& out);
  // Counts, for the step in flight, the padded batch the rank would have run had the step's sequences of the
  // whole lockstep group been split evenly over its ranks (lockstep_clock): the floor of padded_tokens().
  void count_even_padding(std::uint32_t padded) { even_padded_tokens_ += padded; }

  // Counters since construction: steps run (dummy ones included), the sum of padded batch sizes and
  // the sum of real batch sizes over those steps; their difference is the padding waste.
  std::uint64_t steps() const { return steps_; }
  std::uint64_t padded_tokens() const { return padded_tokens_; }
  std::uint64_t even_padded_tokens() const { return even_padded_tokens_; }
  std::uint64_t real_tokens() const { return real_tokens_; }

  // Tokens whose KV the admitted requests hold now: prompt tokens prefilled (or found cached) plus
  // tokens produced, over the running requests (waiting ones hold none).
  std::uint64_t kv_tokens() const { return kv_tokens_; }

  // The cache: blocks held by running requests (vllm:kv_cache_usage_perc is their share of all blocks;
  // free blocks that still cache a prefix count as free, as in vLLM), preemptions, and the prefix cache's
  // queries and hits in tokens (vllm:prefix_cache_queries_total / _hits_total: at every admission, the
  // tokens to compute and the tokens found cached).
  const kv_block_pool& kv_cache() const { return kv_; }
  // With kv.record_events: what the cache recorded since the last call (blocks named when scheduled,
  // evicted when allocation reused them, a reset), in order.
  std::vector<cache_event> take_kv_events() { return kv_.take_events(); }
  // vLLM's reset_prefix_cache (the admin port's /kv-events/reset): no block stays cached.
  void reset_prefix_cache() { kv_.reset_prefix_cache(); }
  std::uint64_t preemptions() const { return preemptions_; }
  std::uint64_t prefix_queries() const { return prefix_queries_; }
  std::uint64_t prefix_hits() const { return prefix_hits_; }

  // The work the rank still owes its requests, waiting and running: prompt tokens not yet prefilled (with
  // a preempted request's tokens to recompute), and tokens not yet produced. A balancer that weighs requests by their tokens tries to even these out.
  std::uint64_t prompt_tokens_pending() const { return prompt_pending_; }
  std::uint64_t decode_tokens_pending() const { return decode_pending_; }

 private:
  struct request {
    request_id id = 0;
    std::uint64_t prompt = 1;        // prompt tokens (>= 1)
    std::uint64_t max_tokens = 1;
    std::uint64_t prefill_left = 0;  // tokens to compute before the next token (the prompt, or every
                                     // token so far after a preemption); 0 = decoding
    std::uint64_t remote = 0;        // waiting, remote_prefilled: prompt tokens whose KV arrived (not counted
                                     // in prefill_left); 0 once admitted
    bool hold = false;               // finished: its blocks go to held_ instead of being freed
    std::uint64_t tokens_left = 0;   // tokens still to produce
    std::uint64_t scheduled = 0;  // tokens scheduled in the step in flight (0 = not in it)
    std::uint64_t kv = 0;         // tokens of KV it holds (computed or cached), counted in kv_tokens_
    chain_builder chain;            // its full blocks' hashes: the prompt's, then the output's as it grows
    std::vector<block_id> blocks;   // the blocks it holds, in token order
    std::size_t named = 0;          // its leading blocks known to the cache by their hash
  };

  void forget(const request& r);  // takes an aborted request's pending work off the totals
  void schedule(request& r, std::uint64_t tokens, std::uint64_t& budget, rank_step& step);
  bool admit(std::uint64_t& budget, rank_step& step);  // the queue's front; false: no room in the cache
  // Room for `tokens` more of `r`'s KV, preempting from the back of the batch; false if `r` itself went.
  bool make_room(std::size_t index, std::uint64_t tokens);
  void preempt_last();
  // Names r's blocks that `tokens` tokens fill (as vLLM caches them when it schedules them, so that a
  // request admitted later in the same step already hits them).
  void name_full_blocks(request& r, std::uint64_t tokens);

  const engine_config config_;
  kv_block_pool kv_;
  std::deque<request> waiting_;   // arrival order
  std::vector<request> running_;  // admission order
  std::unordered_map<request_id, std::vector<block_id>> held_;  // finished `hold` requests' blocks
  bool stepping_ = false;
  std::uint32_t step_batch_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t padded_tokens_ = 0;
  std::uint64_t even_padded_tokens_ = 0;
  std::uint64_t real_tokens_ = 0;
  std::uint64_t kv_tokens_ = 0;
  std::uint64_t prompt_pending_ = 0;  // sum of prefill_left over waiting and running
  std::uint64_t decode_pending_ = 0;  // sum of tokens_left over waiting and running
  std::uint64_t preemptions_ = 0;
  std::uint64_t prefix_queries_ = 0;
  std::uint64_t prefix_hits_ = 0;
};

}  // namespace dplb::mock::sim
