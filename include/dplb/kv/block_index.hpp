#pragma once
// What each rank has in its prefix cache according to its KV-cache events, and the lookup a precise
// prefix-aware pick needs: "how many leading blocks of this prompt does each rank hold".
//
// Blocks are matched by token content, not by the engine's hash (which a router cannot recompute: see
// chain_hash.hpp). A BlockStored event's blocks get dplb's chain hashes: the first continues the chain of
// its parent (found by the parent's engine hash among the blocks this rank stored), or starts one from
// chain_seed(lora_name) when the event names no parent (a prompt's first block); each next block chains
// over the one before, its block_size token ids and its extra keys' digest. A request computes the same
// chain with prompt_chain(). A stored run whose parent this rank's index does not hold (evicted from the
// index, or its event lost) cannot be placed in a chain: it is counted and ignored, as vLLM itself only
// reuses a block whose whole chain before it is cached.
//
// Ignored, and counted: events for another `medium` than "GPU" (absent means GPU; the others are offload
// tiers, which a request reaches only after a copy back, and whose blocks would double-count the GPU's), and
// events for a KV cache group other than 0 (absent means 0): a hybrid model's sliding-window or mamba groups
// emit their own events for the same tokens, and only the full-attention group's blocks make a prefix
// reusable as a whole.
//
// Bounded: at most `blocks_per_rank` blocks per rank (--kv-index-blocks). Beyond, the block stored longest
// ago is dropped first (dplb sees no cache hits, so it cannot keep the engine's LRU order; a bound at or
// above the engine's num_gpu_blocks never drops anything the engine still holds). Within one stored run the
// last block is taken as the oldest, so a chain loses its tail before its head. About 80 bytes per block.
//
// Clearing a rank (AllBlocksCleared, and the caller's resets) is O(1): its blocks are retired at once (the rank
// holds none from then on, and match() skips them), and unlinked and freed later by collect(), in slices of a
// bounded number of blocks, with the rank's key map handed to the caller to free (take_retired_key_maps()):
// a rank's blocks cannot be swapped out whole, as the chain hashes' holder lists are shared between ranks (that
// is what makes a lookup one probe per block, whatever the number of ranks).
//
// Not thread-safe: the caller serialises every call (the events subscriber applies batches and pickers match
// under one lock). match() allocates nothing once `matched` has grown to the number of ranks; apply() only
// as the index grows towards its bound.

#include <boost/unordered/unordered_flat_map.hpp>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dplb/kv/chain_hash.hpp"
#include "dplb/kv/kv_event.hpp"

namespace dplb::kv {

// What applying events did, added to by each apply() (the caller's counters for metrics).
struct apply_counts {
  std::size_t applied = 0;         // events applied: BlockStored placed, BlockRemoved, AllBlocksCleared
  std::size_t ignored = 0;         // events for another medium or KV cache group (or an out-of-range rank)
  std::size_t unplaced = 0;        // BlockStored whose parent block this rank's index does not hold
  std::size_t dropped_blocks = 0;  // blocks dropped to keep a rank within blocks_per_rank
};

class block_index {
 public:
  // Ranks beyond this are ignored (a configuration never has that many; engine stats use the same bound).
  static constexpr std::size_t max_ranks = 4096;

  // `blocks_per_rank`: the bound per rank, in blocks (0: nothing is ever indexed). Node ids are 32-bit: the
  // configuration keeps ranks x blocks_per_rank below 2^32 - 1 (beyond, further blocks are dropped).
  explicit block_index(std::size_t blocks_per_rank) : capacity_(blocks_per_rank) {}

  // Applies one rank's events, in order.
  void apply(std::size_t rank, const event_batch& batch, apply_counts& counts);
  void apply(std::size_t rank, const kv_event& event, apply_counts& counts);

  // Forgets everything a rank holds (AllBlocksCleared; the caller also calls it on a sequence gap, a
  // publisher restart or an unhealthy rank). O(1): the blocks are retired, for collect() to free.
  void clear_rank(std::size_t rank);

  // Unlinks and frees up to `max_blocks` retired blocks; true while some remain.
  bool collect(std::size_t max_blocks);
  bool has_retired() const { return !retired_.empty() || !retired_keys_.empty(); }
  // The retired ranks' key maps, moved into `out`: the caller frees them (without its lock).
  using key_map = boost::unordered_flat_map<engine_block_key, std::uint32_t>;
  void take_retired_key_maps(std::vector<key_map>& out);

  // matched[r] = how many leading blocks of `chain` (a prompt's prompt_chain) rank r holds, for r below
  // `ranks`; `matched` is resized to `ranks` and overwritten. O(blocks matched x ranks holding them).
  void match(std::span<const chain_hash> chain, std::size_t ranks, std::vector<std::uint32_t>& matched) const;

  // Blocks indexed for a rank now (dplb_kv_blocks{rank}).
  std::size_t blocks(std::size_t rank) const { return rank < ranks_.size() ? ranks_[rank].count : 0; }
  std::size_t capacity() const { return capacity_; }

 private:
  static constexpr std::uint32_t none = UINT32_MAX;
  // A rank's blocks belong to its generation; clearing it starts the next, and the blocks of an older one
  // are retired (20 bits: a generation comes round again only after 2^20 clears, and clear_rank() collects
  // everything first when max_retired_lists are pending, so a retired block is never taken for a live one).
  static constexpr std::uint32_t generation_bits = 20;
  static constexpr std::size_t max_retired_lists = 1024;
  static_assert(max_ranks <= (std::size_t{1} << (32 - generation_bits)));
  struct node {
    chain_hash hash = 0;
    engine_block_key key = 0;
    std::uint32_t rank : 32 - generation_bits = 0;
    std::uint32_t generation : generation_bits = 0;
    std::uint32_t newer = none;        // in its rank's list, towards the most recently stored
    std::uint32_t older = none;        // towards the least recently stored: dropped first
    std::uint32_t next_holder = none;  // the next node with the same chain hash (another rank, usually)
  };
  struct rank_state {
    std::uint32_t newest = none;
    std::uint32_t oldest = none;
    std::size_t count = 0;
    std::uint32_t generation = 0;  // modulo 2^generation_bits
    key_map by_key;                // the engine's hash -> node
  };

  void store(std::size_t rank, const block_stored& event, apply_counts& counts);
  void insert(std::size_t rank, engine_block_key key, chain_hash hash, apply_counts& counts);
  void erase(std::uint32_t id);
  // Takes `id` out of its chain hash's holder list and frees it (its rank's list is the caller's business).
  void unlink_and_free(std::uint32_t id);
  bool live(const node& n) const { return n.generation == ranks_[n.rank].generation; }
  rank_state* rank_at(std::size_t rank);

  std::size_t capacity_;
  std::vector<node> nodes_;
  std::vector<std::uint32_t> free_nodes_;
  std::vector<rank_state> ranks_;
  // A chain hash's first holder; the others follow through node::next_holder.
  boost::unordered_flat_map<chain_hash, std::uint32_t> first_holder_;
  std::vector<chain_hash> scratch_;  // a stored run's chain hashes, reused
  // Cleared ranks' lists (each by its newest node, linked through `older`), and their key maps.
  std::vector<std::uint32_t> retired_;
  std::vector<key_map> retired_keys_;
};

}  // namespace dplb::kv
