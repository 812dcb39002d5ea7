#pragma once
// What dplb remembers of the prompts it routed, for the prefix-aware policy: per rank, the chains of
// prompt blocks it sent there, so that a request starting with a prompt a rank has seen goes where the
// engine likely still caches that prefix's KV (vLLM's prefix caching). Approximate by design: dplb does
// not tokenize, so a block is a fixed number of prompt bytes (about 64 tokens), and dplb does not
// see the engine's evictions, so each rank's part is bounded and forgets least recently used blocks first.

#include <array>
#include <boost/unordered/unordered_flat_map.hpp>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace dplb::balancer {

using prefix_hash = std::uint64_t;

// Prompt bytes per block: about 64 tokens at the 4 bytes per token least-tokens also assumes, four of vLLM's
// 16-token KV blocks. A routing decision needs no finer grain, and every block costs a hash-map probe per pick
// and about 50 bytes in the index (bench/cost/prefix_cost.cpp measures a pick).
inline constexpr std::size_t prefix_block_bytes = 256;
// Estimated tokens per block, for thresholds and metrics given in tokens.
inline constexpr std::size_t prefix_block_tokens = 64;
// Blocks of one prompt that are hashed (256 KiB of text): beyond, a prompt's tail matters little to where
// it goes, and the bound keeps a pick's lookup short.
inline constexpr std::size_t max_prefix_blocks = 1024;

// Cuts a prompt, fed in pieces, into blocks of prefix_block_bytes and names each full block by a hash
// chained over the blocks before it, so that equal chains mean equal prompt prefixes. A trailing partial
// block has no hash (as vLLM caches full blocks only). `seed` separates models: the same text sent to
// two models shares no cache.
class prefix_chain_builder {
 public:
  explicit prefix_chain_builder(prefix_hash seed = 0) : parent_(seed) {}

  void feed(std::string_view bytes);
  // Ends a part of the prompt (a chat message): the parts "ab" + "c" and "a" + "bc" differ.
  void separate() { feed(std::string_view("\x1e", 1)); }
  // The chain so far; the builder then starts a new one from `seed`.
  std::vector<prefix_hash> take(prefix_hash seed = 0);

  // A model name's seed.
  static prefix_hash seed_of(std::string_view model);
  // Re-seeds a chain built with seed 0 (the body's model may come after its prompt): block i's hash
  // then depends on the model as well as on every block up to i.
  static void reseed(std::vector<prefix_hash>& chain, prefix_hash seed);

 private:
  void close_block();

  prefix_hash parent_;
  std::array<char, prefix_block_bytes> block_{};  // the block being read
  std::size_t filled_ = 0;                        // its bytes so far
  std::vector<prefix_hash> chain_;
};

// Per rank, a bounded set of prefix blocks with LRU eviction, and the lookup "how many leading blocks
// of this chain did each rank see". Not thread-safe: the policy that owns it runs under the balancer's
// pick lock. Nothing is allocated per block once the tables have grown: nodes live in one vector (freed
// ones reused), a block's holders are a list threaded through its nodes, and the map from block to its
// first holder is open-addressing (boost::unordered_flat_map). About 50 bytes per block held.
class prefix_index {
 public:
  explicit prefix_index(std::size_t blocks_per_rank) : capacity_(blocks_per_rank) {}

  // matched[r] = how many leading blocks of `chain` rank r holds (0 for a rank it knows nothing of);
  // `matched` is resized to `ranks` and overwritten. O(chain length x ranks holding its first block).
  void match(std::span<const prefix_hash> chain, std::size_t ranks, std::vector<std::uint32_t>& matched) const;

  // Rank `rank` now holds `chain`: its blocks become its most recently used (the chain's head most of
  // all, since its head is what later requests share), and its least recently used go beyond capacity.
  void insert(std::size_t rank, std::span<const prefix_hash> chain);

  // Forgets everything a rank held (it was removed).
  void forget(std::size_t rank);

  std::size_t blocks(std::size_t rank) const { return rank < ranks_.size() ? ranks_[rank].count : 0; }
  std::size_t capacity() const { return capacity_; }

 private:
  // Node ids are 32-bit, this last one meaning none: the configuration keeps ranks x blocks per rank
  // below it (--prefix-index-blocks' range).
  static constexpr std::uint32_t none = UINT32_MAX;
  struct node {
    prefix_hash hash = 0;
    std::uint32_t rank = 0;
    std::uint32_t prev = none;         // towards the most recently used, in its rank's list
    std::uint32_t next = none;         // towards the least recently used
    std::uint32_t next_holder = none;  // the block's next holder (another rank's node)
  };
  struct rank_list {
    std::uint32_t head = none;  // most recently used
    std::uint32_t tail = none;  // least recently used: evicted first
    std::size_t count = 0;
  };

  void unlink(std::uint32_t id);
  void push_front(std::uint32_t id);
  void erase(std::uint32_t id);

  std::size_t capacity_;
  std::vector<node> nodes_;
  std::vector<std::uint32_t> free_nodes_;
  std::vector<rank_list> ranks_;
  // A block's first holder; the others follow through node::next_holder. Usually one or two.
  boost::unordered_flat_map<prefix_hash, std::uint32_t> first_holder_;
};

}  // namespace dplb::balancer
