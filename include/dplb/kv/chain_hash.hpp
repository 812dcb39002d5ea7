#pragma once
// The hashes of dplb's KV-cache index, in one place: the key an engine's opaque block hash becomes, and
// dplb's own chain over token content. vLLM names a cached block by a hash chained over the previous
// block's hash, the block's token ids and its extra keys (LoRA name, multimodal hashes, cache_salt), but
// that hash pickles its input and is seeded with random bytes unless PYTHONHASHSEED is set, so a router
// cannot recompute it. dplb hashes the token ids the events carry instead, with the same chaining, and
// keeps the engine's hash only as the key BlockRemoved names. All hashes are XXH3 (64 bits): not a defence
// against an adversary, a collision costs one misplaced request; fixed functions, so that equal content
// hashes equal in every process.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace dplb::kv {

// dplb's hash of one cached block: chained over every block before it in its prompt.
using chain_hash = std::uint64_t;
// A 64-bit digest of an engine's block hash (bytes, sha256 by default, or an integer): a fixed-size key.
using engine_block_key = std::uint64_t;
// A token id (vLLM's vocabularies fit 32 bits; the decoder refuses larger ones).
using token_id = std::uint32_t;

// The key of an engine hash given as bytes, or as an integer. Bytes and integers never share a key
// (different seeds), and an integer is keyed by its 64-bit pattern (signed and unsigned alike).
engine_block_key engine_key_of_bytes(std::span<const std::byte> bytes) noexcept;
engine_block_key engine_key_of_int(std::uint64_t value) noexcept;

// Where a prompt's chain starts: the LoRA adapter's name ("" for the base model), so that blocks of
// different adapters never match. A stored run whose event has lora_id but no lora_name (older vLLM)
// is seeded from lora_seed_of_id(id), which no request produces.
chain_hash chain_seed(std::string_view lora_name) noexcept;
chain_hash lora_seed_of_id(std::int64_t lora_id) noexcept;

// The hash of a block of `tokens` (block_size ids) following `parent` (a previous block's hash, or a
// chain_seed), with the digest of the block's extra keys (0: none; see extra_keys_digest).
chain_hash block_hash(chain_hash parent, std::span<const token_id> tokens, std::uint64_t extra_keys) noexcept;

// A digest of one block's extra keys, as a request computes them: vLLM's extra keys of a text-only
// request are, in order, its LoRA name (on every block) and its cache_salt (first block only); a block
// with neither has none (digest 0). Equal to the digest the decoder computes from an event's
// extra_keys entry holding the same strings (a msgpack array of str). Multimodal keys (hashes of
// images) are not computable by a router, so blocks carrying them never match a text request.
std::uint64_t extra_keys_digest(std::span<const std::string_view> keys) noexcept;

// A prompt's chain: the hashes of its full blocks of `block_size` tokens, from `seed`, written to `out`
// (cleared first; no allocation once `out` has grown). `extra_keys` holds each block's digest, a missing
// entry meaning 0; a partial trailing block has no hash (vLLM caches full blocks only). At most
// `max_blocks` hashes.
void prompt_chain(std::span<const token_id> tokens, std::size_t block_size, chain_hash seed,
                  std::span<const std::uint64_t> extra_keys, std::size_t max_blocks, std::vector<chain_hash>& out);

// A text request's chain, as the events index the blocks the engine stores for it: from chain_seed of its
// LoRA adapter ("" for the base model), each block's extra keys being vLLM's for a text request (the
// adapter's name on every block, then the cache_salt on the first; none without either). A vLLM whose
// events carry no extra_keys is matched for the base model and unsalted prompts only.
void request_chain(std::span<const token_id> tokens, std::size_t block_size, std::string_view lora_name,
                   std::string_view cache_salt, std::size_t max_blocks, std::vector<chain_hash>& out);

namespace detail {
// The digest of extra keys is a walk of their msgpack items in order, each item fed as a tag and a
// number (a length, a count or a value) and then its bytes; the decoder and extra_keys_digest feed the
// same steps. Starts from extra_keys_start; a block's digest is never 0 (0 means no extra keys).
inline constexpr std::uint64_t extra_keys_start = 0x6b762d6578747261ULL;  // "kv-extra"
std::uint64_t extra_keys_feed(std::uint64_t digest, char tag, std::uint64_t number,
                              std::span<const std::byte> bytes = {}) noexcept;
std::uint64_t extra_keys_finish(std::uint64_t digest) noexcept;
}  // namespace detail

}  // namespace dplb::kv
