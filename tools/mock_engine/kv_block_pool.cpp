#include "kv_block_pool.hpp"

#include <algorithm>
#include <cassert>

namespace dplb::mock::sim {
using support::mix64;


block_hash chain_seed(std::string_view cache_salt) {
  if (cache_salt.empty()) return 0;
  return mix64(support::hash_bytes(cache_salt) ^ 0x73616c74ULL);  // "salt": never the unsalted 0 in practice
}

chain_builder::chain_builder(std::uint32_t block_size, block_hash seed)
    : block_size_(block_size), parent_(seed) {}

chain_builder::chain_builder(std::uint32_t block_size, std::string_view cache_salt, bool keep_tokens)
    : block_size_(block_size), parent_(chain_seed(cache_salt)), keep_tokens_(keep_tokens), cache_salt_(cache_salt) {}

void chain_builder::add(token_id token) {
  if (block_size_ == 0) return;
  if (keep_tokens_) tokens_.push_back(token);
  if (filled_ == 0) state_ = mix64(parent_);
  state_ = mix64(state_ ^ token);
  if (++filled_ < block_size_) return;
  chain_.push_back(state_);
  parent_ = state_;
  filled_ = 0;
}

std::vector<block_hash> chain_hashes(std::span<const token_id> tokens, std::uint32_t block_size,
                                     block_hash seed) {
  chain_builder chain(block_size, seed);
  for (const auto token : tokens) chain.add(token);
  return chain.take();
}

kv_block_pool::kv_block_pool(kv_cache_config config) : config_(config), free_count_(config.num_blocks) {}

std::size_t kv_block_pool::cached_prefix(std::span<const block_hash> chain) const {
  if (!config_.prefix_caching) return 0;
  std::size_t n = 0;
  while (n < chain.size() && by_hash_.contains(chain[n])) ++n;
  return n;
}

std::size_t kv_block_pool::free_among_cached(std::span<const block_hash> chain, std::size_t count) const {
  std::size_t free = 0;
  for (std::size_t i = 0; i < count; ++i) free += blocks_[by_hash_.at(chain[i])].refs == 0 ? 1 : 0;
  return free;
}

void kv_block_pool::take_cached(std::span<const block_hash> chain, std::size_t count,
                                std::vector<block_id>& blocks) {
  for (std::size_t i = 0; i < count; ++i) {
    const block_id id = by_hash_.at(chain[i]);
    if (blocks_[id].refs++ == 0) unlink(id);
    blocks.push_back(id);
  }
}

bool kv_block_pool::allocate(std::size_t count, std::vector<block_id>& blocks) {
  if (count > free_count_) return false;
  removed_blocks* evicted = nullptr;
  for (std::size_t i = 0; i < count; ++i) {
    const block_id id = take_front();
    auto& b = blocks_[id];
    if (b.named) {  // evicted: its prefix is no longer cached
      by_hash_.erase(b.hash);
      b.named = false;
      if (config_.record_events) {
        // One event for the evictions of one allocation (vLLM sends one per block; the same facts).
        if (evicted == nullptr) evicted = &std::get<removed_blocks>(events_.emplace_back(removed_blocks{}));
        evicted->hashes.push_back(b.hash);
      }
    }
    b.refs = 1;
    blocks.push_back(id);
  }
  return true;
}

bool kv_block_pool::name(block_id id, block_hash hash) {
  if (!config_.prefix_caching) return false;
  auto& b = blocks_[id];
  if (b.named) return false;
  if (!by_hash_.emplace(hash, id).second) return false;
  b.named = true;
  b.hash = hash;
  return true;
}

void kv_block_pool::name_chain(std::span<const block_id> blocks, const chain_builder& chain, std::size_t first,
                               std::size_t end) {
  const auto& hashes = chain.chain();
  const std::size_t block_size = config_.block_size;
  stored_blocks* run = nullptr;  // the run being logged; ended by a block that did not get its name
  for (std::size_t i = first; i < end; ++i) {
    if (!name(blocks[i], hashes[i])) {
      run = nullptr;
      continue;
    }
    if (!config_.record_events) continue;
    if (run == nullptr) {
      stored_blocks stored;
      if (i > 0) stored.parent = hashes[i - 1];
      stored.cache_salt = chain.cache_salt();
      run = &std::get<stored_blocks>(events_.emplace_back(std::move(stored)));
    }
    run->hashes.push_back(hashes[i]);
    const auto tokens = chain.tokens();
    assert(tokens.size() >= (i + 1) * block_size);  // the chain keeps its tokens when events are recorded
    const auto block = tokens.subspan(i * block_size, block_size);
    run->tokens.insert(run->tokens.end(), block.begin(), block.end());
  }
}

void kv_block_pool::reset_prefix_cache() {
  for (auto& b : blocks_) b.named = false;
  by_hash_.clear();
  if (config_.record_events) events_.emplace_back(cache_cleared{});
}

void kv_block_pool::release(std::vector<block_id>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    auto& b = blocks_[*it];
    assert(b.refs > 0);
    if (--b.refs == 0) push_back(*it);
  }
  blocks.clear();
}

block_id kv_block_pool::take_front() {
  if (blocks_.size() < config_.num_blocks) {  // a block never used yet
    blocks_.emplace_back();
    --free_count_;
    return static_cast<block_id>(blocks_.size() - 1);
  }
  const block_id id = head_;
  unlink(id);
  return id;
}

void kv_block_pool::unlink(block_id id) {
  auto& b = blocks_[id];
  (b.prev == none ? head_ : blocks_[b.prev].next) = b.next;
  (b.next == none ? tail_ : blocks_[b.next].prev) = b.prev;
  b.prev = b.next = none;
  --free_count_;
}

void kv_block_pool::push_back(block_id id) {
  auto& b = blocks_[id];
  b.prev = tail_;
  b.next = none;
  (tail_ == none ? head_ : blocks_[tail_].next) = id;
  tail_ = id;
  ++free_count_;
}

}  // namespace dplb::mock::sim
