#pragma once
// Simulated serving, the pure part: one DP rank's continuous-batching scheduler, shaped after vLLM's V1
// scheduler, and the cost model of one engine step. No sockets, no clocks: the caller says when a step
// begins and ends (see lockstep_clock.hpp), so that every outcome is deterministic and unit-testable.

#include <chrono>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

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
class batch_scheduler {
 public:
  explicit batch_scheduler(engine_config config) : config_(std::move(config)) {}

  // Queues a request; ids are unique among the requests the scheduler holds. prompt_tokens 0 counts
  // as 1 (the step that samples the first token processes one position at least); max_tokens >= 1.
  void submit(request_id id, std::uint64_t prompt_tokens, std::uint64_t max_tokens);

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

  // Counters since construction: steps run (dummy ones included), the sum of padded batch sizes and
  // the sum of real batch sizes over those steps; their difference is the padding waste.
  std::uint64_t steps() const { return steps_; }
  std::uint64_t padded_tokens() const { return padded_tokens_; }
  std::uint64_t real_tokens() const { return real_tokens_; }

  // Tokens whose KV the admitted requests hold now: prompt tokens prefilled plus tokens produced, over
  // the running requests (waiting ones hold none). What vllm:kv_cache_usage_perc is a fraction of.
  std::uint64_t kv_tokens() const { return kv_tokens_; }

  // The work the rank still owes its requests, waiting and running: prompt tokens not yet prefilled, and
  // tokens not yet produced. A balancer that weighs requests by their tokens tries to even these out.
  std::uint64_t prompt_tokens_pending() const { return prompt_pending_; }
  std::uint64_t decode_tokens_pending() const { return decode_pending_; }

 private:
  struct request {
    request_id id;
    std::uint64_t prefill_left;  // prompt tokens not yet prefilled; 0 = decoding
    std::uint64_t tokens_left;   // tokens still to produce
    std::uint64_t scheduled;     // tokens scheduled in the step in flight (0 = not in it)
    std::uint64_t kv = 0;        // tokens of KV it holds (prefilled and produced), counted in kv_tokens_
  };

  void forget(const request& r);  // takes an aborted request's pending work off the totals

  const engine_config config_;
  std::deque<request> waiting_;   // arrival order
  std::vector<request> running_;  // admission order
  bool stepping_ = false;
  std::uint32_t step_batch_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t padded_tokens_ = 0;
  std::uint64_t real_tokens_ = 0;
  std::uint64_t kv_tokens_ = 0;
  std::uint64_t prompt_pending_ = 0;  // sum of prefill_left over waiting and running
  std::uint64_t decode_pending_ = 0;  // sum of tokens_left over waiting and running
};

}  // namespace dplb::mock::sim
