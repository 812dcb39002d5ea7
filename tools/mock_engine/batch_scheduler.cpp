#include "batch_scheduler.hpp"

#include <algorithm>
#include <limits>

namespace dplb::mock::sim {

std::vector<std::uint32_t> default_capture_sizes(std::uint32_t max_num_seqs) {
  // vLLM: min(max_num_seqs * 2, 512), computed without overflowing a huge max_num_seqs.
  const std::uint32_t largest = max_num_seqs >= 256 ? 512 : max_num_seqs * 2;
  std::vector<std::uint32_t> sizes;
  for (const std::uint32_t size : {1U, 2U, 4U}) {
    if (size <= largest) sizes.push_back(size);
  }
  for (std::uint32_t size = 8; size < 256 && size <= largest; size += 8) sizes.push_back(size);
  for (std::uint32_t size = 256; size <= largest; size += 16) sizes.push_back(size);
  return sizes;
}

std::uint32_t padded_batch(std::uint32_t n, const std::vector<std::uint32_t>& sizes) {
  if (n == 0) return 0;
  const auto at = std::lower_bound(sizes.begin(), sizes.end(), n);
  return at == sizes.end() ? n : *at;
}

void batch_scheduler::submit(request_id id, std::uint64_t prompt_tokens, std::uint64_t max_tokens) {
  waiting_.push_back(
      request{id, std::max<std::uint64_t>(prompt_tokens, 1), std::max<std::uint64_t>(max_tokens, 1), 0});
  prompt_pending_ += waiting_.back().prefill_left;
  decode_pending_ += waiting_.back().tokens_left;
}

void batch_scheduler::forget(const request& r) {
  prompt_pending_ -= r.prefill_left;
  decode_pending_ -= r.tokens_left;
}

bool batch_scheduler::abort(request_id id) {
  const auto same = [id](const request& r) { return r.id == id; };
  if (const auto at = std::find_if(running_.begin(), running_.end(), same); at != running_.end()) {
    kv_tokens_ -= at->kv;
    forget(*at);
    running_.erase(at);  // erase, not swap: admission order is the scheduling order
    return true;
  }
  if (const auto at = std::find_if(waiting_.begin(), waiting_.end(), same); at != waiting_.end()) {
    forget(*at);
    waiting_.erase(at);
    return true;
  }
  return false;
}

rank_step batch_scheduler::begin_step() {
  stepping_ = true;
  rank_step step;
  // vLLM V1 order: the running requests first (so decodes are never starved by new prompts), then
  // admissions from the queue. The budget check matters only with chunked prefill.
  const bool budgeted = config_.max_num_batched_tokens != 0;
  std::uint64_t budget =
      budgeted ? config_.max_num_batched_tokens : std::numeric_limits<std::uint64_t>::max();
  const auto take = [&](request& r) {
    const std::uint64_t want = r.prefill_left == 0 ? 1 : r.prefill_left;
    r.scheduled = std::min(want, budget);
    budget -= r.scheduled;
    if (r.prefill_left != 0) step.prefill_tokens += r.scheduled;
    ++step.batch;
  };
  for (auto& r : running_) {
    if (budget == 0) break;
    take(r);
  }
  while (!waiting_.empty() && running_.size() < config_.max_num_seqs && budget != 0) {
    running_.push_back(waiting_.front());
    waiting_.pop_front();
    take(running_.back());
  }
  step_batch_ = step.batch;
  return step;
}

void batch_scheduler::end_step(std::uint32_t padded, std::vector<token_event>& out) {
  stepping_ = false;
  ++steps_;
  padded_tokens_ += padded;
  real_tokens_ += step_batch_;
  for (auto& r : running_) {
    if (r.scheduled == 0) continue;  // admitted after the budget ran out, or not scheduled
    if (r.prefill_left != 0) {
      r.prefill_left -= r.scheduled;
      prompt_pending_ -= r.scheduled;
      r.kv += r.scheduled;
      kv_tokens_ += r.scheduled;
      r.scheduled = 0;
      if (r.prefill_left != 0) continue;  // more chunks to come: no token yet
    } else {
      r.scheduled = 0;
    }
    --r.tokens_left;
    --decode_pending_;
    ++r.kv;
    ++kv_tokens_;
    out.push_back(token_event{r.id, r.tokens_left == 0});
    if (r.tokens_left == 0) kv_tokens_ -= r.kv;  // finished: its blocks are freed
  }
  std::erase_if(running_, [](const request& r) { return r.tokens_left == 0; });
}

}  // namespace dplb::mock::sim
