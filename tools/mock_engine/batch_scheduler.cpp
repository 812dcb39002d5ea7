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

void batch_scheduler::submit(request_id id, std::uint64_t prompt_tokens, std::uint64_t max_tokens,
                             chain_builder chain, bool remote_prefilled, bool hold) {
  request r;
  r.id = id;
  r.prompt = std::max<std::uint64_t>(prompt_tokens, 1);
  r.max_tokens = std::max<std::uint64_t>(max_tokens, 1);
  r.remote = remote_prefilled ? r.prompt - 1 : 0;
  r.prefill_left = r.prompt - r.remote;
  r.hold = hold;
  r.tokens_left = r.max_tokens;
  r.chain = std::move(chain);
  prompt_pending_ += r.prefill_left;
  decode_pending_ += r.tokens_left;
  waiting_.push_back(std::move(r));
}

void batch_scheduler::forget(const request& r) {
  prompt_pending_ -= r.prefill_left;
  decode_pending_ -= r.tokens_left;
}

bool batch_scheduler::abort(request_id id) {
  const auto same = [id](const request& r) { return r.id == id; };
  if (const auto at = std::find_if(running_.begin(), running_.end(), same); at != running_.end()) {
    kv_tokens_ -= at->kv;
    kv_.release(at->blocks);
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

bool batch_scheduler::release_held(request_id id) {
  const auto at = held_.find(id);
  if (at == held_.end()) return false;
  kv_.release(at->second);
  held_.erase(at);
  return true;
}

void batch_scheduler::schedule(request& r, std::uint64_t tokens, std::uint64_t& budget, rank_step& step) {
  r.scheduled = tokens;
  budget -= tokens;
  if (r.prefill_left != 0) step.prefill_tokens += tokens;
  ++step.batch;
}

void batch_scheduler::preempt_last() {
  request r = std::move(running_.back());
  running_.pop_back();
  kv_tokens_ -= r.kv;
  kv_.release(r.blocks);
  r.kv = 0;
  r.named = 0;
  r.scheduled = 0;
  // Recompute: the prompt and every token produced so far are prefilled again before the next token.
  const std::uint64_t recompute = r.prompt + (r.max_tokens - r.tokens_left);
  prompt_pending_ += recompute - r.prefill_left;
  r.prefill_left = recompute;
  waiting_.push_front(std::move(r));
  ++preemptions_;
}

bool batch_scheduler::make_room(std::size_t index, std::uint64_t tokens) {
  const std::uint64_t held = running_[index].blocks.size();
  const std::uint64_t wanted = kv_.blocks_for(running_[index].kv + tokens);
  const std::uint64_t need = wanted > held ? wanted - held : 0;
  while (need > kv_.free_blocks()) {
    const bool self = running_.size() - 1 == index;
    preempt_last();
    if (self) return false;
  }
  kv_.allocate(need, running_[index].blocks);
  return true;
}

bool batch_scheduler::admit(std::uint64_t& budget, rank_step& step) {
  request& r = waiting_.front();
  const std::uint64_t block_size = config_.kv.block_size;
  const std::uint64_t total = r.prefill_left + r.remote;  // a waiting request holds no KV
  // The last token is always computed (it is what samples the next one), so at most total - 1 come
  // from the cache, in whole blocks.
  const std::uint64_t hit_blocks =
      std::min<std::uint64_t>(kv_.cached_prefix(r.chain.chain()), (total - 1) / block_size);
  const std::uint64_t hit_tokens = hit_blocks * block_size;
  // Tokens whose KV is there without computing: the cache's, or more, those pulled from a prefill engine
  // (which still need blocks of their own beyond the cached ones).
  const std::uint64_t known = std::max(hit_tokens, r.remote);
  const std::uint64_t tokens = std::min(total - known, budget);
  const std::uint64_t fresh = kv_.blocks_for(known + tokens) - hit_blocks;
  if (fresh + kv_.free_among_cached(r.chain.chain(), hit_blocks) > kv_.free_blocks()) return false;
  kv_.take_cached(r.chain.chain(), hit_blocks, r.blocks);
  kv_.allocate(fresh, r.blocks);
  if (config_.kv.prefix_caching) {
    prefix_queries_ += total;
    prefix_hits_ += hit_tokens;
  }
  r.kv = known;
  r.named = hit_blocks;
  kv_tokens_ += known;
  const std::uint64_t saved = known - r.remote;  // of prefill_left (the pulled tokens were never in it)
  r.prefill_left -= saved;
  prompt_pending_ -= saved;
  r.remote = 0;
  running_.push_back(std::move(r));
  waiting_.pop_front();
  schedule(running_.back(), tokens, budget, step);
  name_full_blocks(running_.back(), known + tokens);
  return true;
}

void batch_scheduler::name_full_blocks(request& r, std::uint64_t tokens) {
  const auto& chain = r.chain.chain();
  const std::size_t full = std::min<std::size_t>(tokens / config_.kv.block_size, chain.size());
  if (r.named >= full) return;
  kv_.name_chain(r.blocks, r.chain, r.named, full);
  r.named = full;
}

rank_step batch_scheduler::begin_step() {
  stepping_ = true;
  rank_step step;
  // vLLM V1 order: the running requests first (so decodes are never starved by new prompts), then
  // admissions from the queue. The budget check matters only with chunked prefill.
  const bool budgeted = config_.max_num_batched_tokens != 0;
  std::uint64_t budget =
      budgeted ? config_.max_num_batched_tokens : std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t preempted_before = preemptions_;
  for (std::size_t i = 0; i < running_.size() && budget != 0; ++i) {
    const auto& r = running_[i];
    const std::uint64_t tokens = std::min<std::uint64_t>(r.prefill_left == 0 ? 1 : r.prefill_left, budget);
    if (!make_room(i, tokens)) break;  // it was the last of the batch, and went back to the queue
    schedule(running_[i], tokens, budget, step);
    name_full_blocks(running_[i], running_[i].kv + tokens);
  }
  // As vLLM: a step that had to preempt admits nobody (the cache is full).
  while (preemptions_ == preempted_before && !waiting_.empty() && running_.size() < config_.max_num_seqs && budget != 0) {
    if (!admit(budget, step)) break;  // no room in the cache: the queue keeps its order
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
    // The scheduled tokens' KV is computed now (a decode computes the token sampled last step).
    r.kv += r.scheduled;
    kv_tokens_ += r.scheduled;
    if (r.prefill_left != 0) {
      r.prefill_left -= r.scheduled;
      prompt_pending_ -= r.scheduled;
      r.scheduled = 0;
      if (r.prefill_left != 0) continue;  // more chunks to come: no token yet
    } else {
      r.scheduled = 0;
    }
    --r.tokens_left;
    --decode_pending_;
    r.chain.add(generated_token);  // its KV is computed next step, in the block chain's order
    out.push_back(token_event{r.id, r.tokens_left == 0});
    if (r.tokens_left == 0) {  // finished: its blocks are freed (and stay cached until reused), or held
      kv_tokens_ -= r.kv;
      if (r.hold) {
        held_.emplace(r.id, std::move(r.blocks));
      } else {
        kv_.release(r.blocks);
      }
    }
  }
  std::erase_if(running_, [](const request& r) { return r.tokens_left == 0; });
}

}  // namespace dplb::mock::sim
