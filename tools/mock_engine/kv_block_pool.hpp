#pragma once
// Simulated serving, the pure part: one DP rank's KV cache as vLLM V1's block pool keeps it. The cache is
// `num_blocks` blocks of `block_size` tokens. A request holds a list of blocks (a reference on each); a
// block that no request holds is free, and the free blocks form one least-recently-used queue, which
// allocation takes from the front. With prefix caching, a block full of prompt tokens is named by the hash
// of its tokens chained over the previous block's hash; while the block lives (held, or free but not yet
// reallocated) a request whose prompt starts with the same chain reuses it instead of prefilling it again.
// No sockets, no clocks, not thread-safe.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "dplb/support/hashing.hpp"

namespace dplb::mock::sim {

using block_hash = std::uint64_t;
using block_id = std::uint32_t;
// A token id. 32 bits, as every real vocabulary and vLLM's KV events (whose consumers refuse larger ids).
using token_id = std::uint32_t;

struct kv_cache_config {
  std::uint32_t block_size = 16;    // tokens per block (vLLM --block-size)
  std::uint32_t num_blocks = 65536; // blocks per rank (vLLM's num_gpu_blocks; --kv-blocks)
  bool prefix_caching = true;       // vLLM --enable-prefix-caching, on by default in V1
  // Keep a log of the blocks named and evicted (take_events), for vLLM's KV-cache events
  // (--kv-events-port). Off: nothing is recorded.
  bool record_events = false;
};

class chain_builder;

// What the log of a cache records, as vLLM's KV-cache events say it (kv_event_encoder.hpp writes them).
// A run of a request's consecutive blocks that have just been named (became cached), in chain order,
// extending `parent` (none: the run starts its prompt's chain).
struct stored_blocks {
  std::vector<block_hash> hashes;
  std::optional<block_hash> parent;
  std::vector<token_id> tokens;  // block_size ids per block, in order
  // The request's cache_salt ("" if none): vLLM puts it in the extra keys of the prompt's first block.
  std::string cache_salt;
};
// Named blocks that lost their name because allocation reused them (eviction).
struct removed_blocks {
  std::vector<block_hash> hashes;
};
// The prefix cache was reset: no block is named any more.
struct cache_cleared {};
using cache_event = std::variant<stored_blocks, removed_blocks, cache_cleared>;

class kv_block_pool {
 public:
  explicit kv_block_pool(kv_cache_config config);

  const kv_cache_config& config() const { return config_; }
  std::uint32_t free_blocks() const { return free_count_; }  // unheld, cached or not
  std::uint32_t used_blocks() const { return config_.num_blocks - free_count_; }
  std::size_t cached_blocks() const { return by_hash_.size(); }  // named blocks, held or free

  // Blocks needed to hold `tokens` tokens.
  std::uint64_t blocks_for(std::uint64_t tokens) const {
    return (tokens + config_.block_size - 1) / config_.block_size;
  }

  // How many of `chain`'s leading blocks are cached (0 without prefix caching).
  std::size_t cached_prefix(std::span<const block_hash> chain) const;

  // Of those leading `count` cached blocks, how many are free now: they leave the free queue when a
  // request takes them, so they count against the room an admission needs.
  std::size_t free_among_cached(std::span<const block_hash> chain, std::size_t count) const;

  // Appends the first `count` blocks of `chain` (all cached: see cached_prefix) to `blocks`, taking a
  // reference on each.
  void take_cached(std::span<const block_hash> chain, std::size_t count, std::vector<block_id>& blocks);

  // Appends `count` fresh blocks to `blocks`, taken from the front of the free queue (a cached one loses
  // its name). False, and nothing taken, if fewer than `count` are free.
  bool allocate(std::size_t count, std::vector<block_id>& blocks);

  // Names a held block that has just been filled with prompt tokens, so that later requests may reuse it.
  // A chain already cached under another block keeps that one (this block stays unnamed, as in vLLM).
  // Whether the block got the name. Records nothing: see name_chain.
  bool name(block_id block, block_hash hash);

  // Names blocks[i] by chain's hash i for i in [first, end) (the request's blocks, in token order, and
  // its chain), as name() does. With record_events, each run of consecutive blocks that got their name is
  // logged as one stored_blocks, with its tokens from `chain` (which must keep them) and its parent, the
  // chain's hash before the run.
  void name_chain(std::span<const block_id> blocks, const chain_builder& chain, std::size_t first,
                  std::size_t end);

  // vLLM's reset_prefix_cache: every block loses its name (held ones too, so that the cache is empty as
  // the cache_cleared event says; their requests keep them, uncached). Logs cache_cleared.
  void reset_prefix_cache();

  // The log since the last call, in order (empty without record_events).
  std::vector<cache_event> take_events() { return std::exchange(events_, {}); }

  // Drops a request's references and clears `blocks`. Blocks that nobody holds any more join the back of
  // the free queue last block first, as vLLM frees them: a prompt's tail is evicted before its head,
  // which other requests are likelier to share.
  void release(std::vector<block_id>& blocks);

 private:
  static constexpr block_id none = UINT32_MAX;

  struct block {
    std::uint32_t refs = 0;
    bool named = false;
    block_hash hash = 0;
    block_id prev = none;  // in the free queue, while refs == 0
    block_id next = none;
  };

  void unlink(block_id id);     // from the free queue
  void push_back(block_id id);  // to the free queue
  block_id take_front();        // the next block allocation gets, out of the free queue

  const kv_cache_config config_;
  // The free queue starts as every block in id order, and freed blocks join its back, so the blocks never
  // used yet are always its front: they are left implicit (ids from blocks_.size() on), and the table
  // grows as they are first used. An idle engine's cache costs nothing, whatever --kv-blocks says.
  std::vector<block> blocks_;
  block_id head_ = none;  // the freed blocks' queue: least recently freed first
  block_id tail_ = none;
  std::uint32_t free_count_ = 0;  // never-used blocks plus the queue
  std::unordered_map<block_hash, block_id> by_hash_;
  std::vector<cache_event> events_;
};

// A word's pseudo-token id: a hash of its bytes, in [0, 2^31) (a token id fits 32 bits, and below 2^31
// it is also a non-negative int32 for any consumer that reads it signed). The mock's stand-in for a
// tokenizer: a prompt is one token per whitespace-separated word, and every generated token is the word
// "tok".
constexpr token_id word_token(std::string_view word) {
  return static_cast<token_id>(support::hash_bytes(word) & 0x7fffffffU);
}
inline constexpr token_id generated_token = word_token("tok");

// Where a request's chain starts: 0 without a cache_salt, else a hash of the salt, so that salted and
// unsalted prompts (and prompts of different salts) never share a block.
block_hash chain_seed(std::string_view cache_salt);

// The chain of block hashes of a request's full blocks: block i's hash mixes block i-1's hash (`seed` for
// the first) with its `block_size` token ids. A partial last block has no hash yet (vLLM caches full
// blocks only). Built token by token, so that a long prompt needs no list of its tokens, and a request's
// chain grows with the tokens it generates (vLLM caches full blocks of output too). With KV-cache events
// on it also keeps the tokens (the events carry them) and the request's cache_salt.
class chain_builder {
 public:
  explicit chain_builder(std::uint32_t block_size = 0, block_hash seed = 0);
  // A request's chain: seeded by its cache_salt (chain_seed), keeping its tokens if `keep_tokens`.
  chain_builder(std::uint32_t block_size, std::string_view cache_salt, bool keep_tokens);

  void add(token_id token);  // no-op with block size 0 (a request that shares nothing)
  const std::vector<block_hash>& chain() const { return chain_; }
  std::vector<block_hash> take() { return std::move(chain_); }
  std::uint32_t block_size() const { return block_size_; }
  // Every token added, in order, if kept (else empty).
  std::span<const token_id> tokens() const { return tokens_; }
  const std::string& cache_salt() const { return cache_salt_; }

 private:
  std::uint32_t block_size_;
  std::uint32_t filled_ = 0;  // tokens in the block being built
  block_hash parent_;
  std::uint64_t state_ = 0;
  std::vector<block_hash> chain_;
  bool keep_tokens_ = false;
  std::vector<token_id> tokens_;
  std::string cache_salt_;
};

// The same over a list of tokens.
std::vector<block_hash> chain_hashes(std::span<const token_id> tokens, std::uint32_t block_size,
                                     block_hash seed = 0);

}  // namespace dplb::mock::sim
