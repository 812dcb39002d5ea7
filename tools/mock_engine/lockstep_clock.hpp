#pragma once
// Simulated serving, the pure part: the clock of ranks that step together. With --dp-lockstep all the
// ranks of the process share one clock, as MoE DP ranks do in vLLM (a collective in every step): a
// step runs while any rank has work, an idle rank runs a dummy batch, and every rank pads its batch to
// the largest CUDA-graph-padded batch among them. Without it, each rank has a clock of its own and
// steps only while it has work. No sockets, no real time: the I/O side (sim_engine.hpp) arms a timer
// for step_end() and calls end_step() when it fires.

#include <cstdint>
#include <vector>

#include "batch_scheduler.hpp"

namespace dplb::mock::sim {

// Simulated duration of a step whose ranks all ran `padded` sequences and whose largest prefill was
// `prefill_tokens` tokens: step_base + step_per_token * padded + prefill_per_token * prefill_tokens.
sim_duration step_duration(const engine_config& config, std::uint32_t padded, std::uint64_t prefill_tokens);

class lockstep_clock {
 public:
  // `members` must outlive the clock and be stepped only through it. One member: a rank on its own.
  lockstep_clock(engine_config config, std::vector<batch_scheduler*> members);

  bool stepping() const { return stepping_; }
  sim_time step_begin() const { return step_begin_; }  // the step in flight (or the last one): its start
  sim_time step_end() const { return step_end_; }      // ... and its end

  // Begins a step at `now` unless one is in flight or no member has work; returns whether one began.
  // Every member runs begin_step(); the step lasts step_duration(padded, largest prefill), padded
  // being the largest of padded_batch(max(batch, 1)) over the members (an idle member's dummy batch
  // counts as 1).
  bool begin_step(sim_time now);

  // Ends the step in flight: every member counts `padded` and appends the tokens it produced (member
  // order, then admission order). The caller begins the next step, usually at the old step_end().
  void end_step(std::vector<token_event>& out);

  std::uint32_t padded() const { return padded_; }  // the padded batch of the last step begun

 private:
  const engine_config config_;
  std::vector<batch_scheduler*> members_;
  bool stepping_ = false;
  sim_time step_begin_{0};
  sim_time step_end_{0};
  std::uint32_t padded_ = 0;
  std::uint32_t even_padded_ = 0;  // the step's padded batch had its sequences been split evenly
};

}  // namespace dplb::mock::sim
