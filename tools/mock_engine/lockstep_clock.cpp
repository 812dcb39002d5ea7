#include "lockstep_clock.hpp"

#include <algorithm>
#include <utility>

namespace dplb::mock::sim {

sim_duration step_duration(const engine_config& config, std::uint32_t padded, std::uint64_t prefill_tokens) {
  return config.step_base + config.step_per_token * static_cast<std::int64_t>(padded) +
         config.prefill_per_token * static_cast<std::int64_t>(prefill_tokens);
}

lockstep_clock::lockstep_clock(engine_config config, std::vector<batch_scheduler*> members)
    : config_(std::move(config)), members_(std::move(members)) {}

bool lockstep_clock::begin_step(sim_time now) {
  if (stepping_) return false;
  if (std::none_of(members_.begin(), members_.end(),
                   [](const batch_scheduler* m) { return m->has_work(); })) {
    return false;
  }
  // vLLM pads every DP rank to the largest token count among them (they meet in the MoE all-to-all),
  // then to a capture size: the same as the largest of the padded batches. A rank's prefill runs in
  // its own part of the step, so the slowest prefill sets the rest of the step's length.
  std::uint32_t padded = 0;
  std::uint64_t prefill = 0;
  std::uint64_t sequences = 0;
  for (auto* member : members_) {
    const auto step = member->begin_step();
    padded = std::max(padded, padded_batch(std::max<std::uint32_t>(step.batch, 1), config_.capture_sizes));
    prefill = std::max(prefill, step.prefill_tokens);
    sequences += step.batch;
  }
  padded_ = padded;
  // The floor for this step: its sequences split as evenly as they can be (the largest rank's batch is at
  // least their mean, rounded up), whoever placed them.
  const auto even = static_cast<std::uint32_t>((sequences + members_.size() - 1) / members_.size());
  even_padded_ = padded_batch(std::max<std::uint32_t>(even, 1), config_.capture_sizes);
  step_begin_ = now;
  step_end_ = now + step_duration(config_, padded, prefill);
  stepping_ = true;
  return true;
}

void lockstep_clock::end_step(std::vector<token_event>& out) {
  if (!stepping_) return;
  stepping_ = false;
  for (auto* member : members_) {
    member->count_even_padding(even_padded_);
    member->end_step(padded_, out);
  }
}

}  // namespace dplb::mock::sim
