#include "dplb/kv/chain_hash.hpp"

#include <algorithm>
#include <array>
#include <cstring>

// Header-only xxHash: XXH3 inlines into the chain loops, and no runtime library ships with dplb. Only this
// file includes it (its macros stay out of the rest of a unity group's code, which does not use them).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace dplb::kv {

namespace chain_hash_detail {

// Distinct seeds keep the kinds of input apart: an 8-byte engine hash given as bytes and the same value
// given as an integer are different blocks to the engine, so they are different keys here too.
constexpr std::uint64_t engine_bytes_seed = 0x656e672d62797465ULL;  // "eng-byte"
constexpr std::uint64_t engine_int_seed = 0x656e672d696e7421ULL;    // "eng-int!"
constexpr std::uint64_t base_model_seed = 0x646c622d62617365ULL;    // "dlb-base"
constexpr std::uint64_t lora_name_seed = 0x646c622d6c6f7261ULL;     // "dlb-lora"
constexpr std::uint64_t lora_id_seed = 0x646c622d6c6f6964ULL;       // "dlb-loid"

std::uint64_t hash_u64(std::uint64_t value, std::uint64_t seed) noexcept {
  std::array<unsigned char, 8> le{};
  for (std::size_t i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(value >> (8 * i));
  return XXH3_64bits_withSeed(le.data(), le.size(), seed);
}

}  // namespace chain_hash_detail

engine_block_key engine_key_of_bytes(std::span<const std::byte> bytes) noexcept {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), chain_hash_detail::engine_bytes_seed);
}

engine_block_key engine_key_of_int(std::uint64_t value) noexcept {
  return chain_hash_detail::hash_u64(value, chain_hash_detail::engine_int_seed);
}

chain_hash chain_seed(std::string_view lora_name) noexcept {
  if (lora_name.empty()) return chain_hash_detail::base_model_seed;
  return XXH3_64bits_withSeed(lora_name.data(), lora_name.size(), chain_hash_detail::lora_name_seed);
}

chain_hash lora_seed_of_id(std::int64_t lora_id) noexcept {
  return chain_hash_detail::hash_u64(static_cast<std::uint64_t>(lora_id), chain_hash_detail::lora_id_seed);
}

chain_hash block_hash(chain_hash parent, std::span<const token_id> tokens, std::uint64_t extra_keys) noexcept {
  // Token ids are hashed as they lie in memory (host order): the hashes are compared only within one
  // process, never sent anywhere.
  chain_hash h = XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
  if (extra_keys != 0) h = chain_hash_detail::hash_u64(extra_keys, h);
  return h;
}

namespace detail {

std::uint64_t extra_keys_feed(std::uint64_t digest, char tag, std::uint64_t number,
                              std::span<const std::byte> bytes) noexcept {
  std::array<unsigned char, 9> head{};
  head[0] = static_cast<unsigned char>(tag);
  for (std::size_t i = 0; i < 8; ++i) head[1 + i] = static_cast<unsigned char>(number >> (8 * i));
  digest = XXH3_64bits_withSeed(head.data(), head.size(), digest);
  if (!bytes.empty()) digest = XXH3_64bits_withSeed(bytes.data(), bytes.size(), digest);
  return digest;
}

std::uint64_t extra_keys_finish(std::uint64_t digest) noexcept { return digest == 0 ? 1 : digest; }

}  // namespace detail

std::uint64_t extra_keys_digest(std::span<const std::string_view> keys) noexcept {
  if (keys.empty()) return 0;
  // The steps of a msgpack array of str, as the decoder walks an event's extra_keys entry.
  std::uint64_t d = detail::extra_keys_feed(detail::extra_keys_start, 'a', keys.size());
  for (const std::string_view key : keys)
    d = detail::extra_keys_feed(d, 's', key.size(), std::as_bytes(std::span(key.data(), key.size())));
  return detail::extra_keys_finish(d);
}

void prompt_chain(std::span<const token_id> tokens, std::size_t block_size, chain_hash seed,
                  std::span<const std::uint64_t> extra_keys, std::size_t max_blocks, std::vector<chain_hash>& out) {
  out.clear();
  if (block_size == 0) return;
  const std::size_t blocks = std::min(tokens.size() / block_size, max_blocks);
  chain_hash parent = seed;
  for (std::size_t i = 0; i < blocks; ++i) {
    const std::uint64_t extra = i < extra_keys.size() ? extra_keys[i] : 0;
    parent = block_hash(parent, tokens.subspan(i * block_size, block_size), extra);
    out.push_back(parent);
  }
}

void request_chain(std::span<const token_id> tokens, std::size_t block_size, std::string_view lora_name,
                   std::string_view cache_salt, std::size_t max_blocks, std::vector<chain_hash>& out) {
  out.clear();
  if (block_size == 0) return;
  // vLLM's extra keys of a text request: the adapter's name on every block, then the salt on the first.
  std::array<std::string_view, 2> keys{};
  std::size_t first_count = 0;
  if (!lora_name.empty()) keys[first_count++] = lora_name;
  const std::size_t later_count = first_count;
  if (!cache_salt.empty()) keys[first_count++] = cache_salt;
  const std::uint64_t first_extra = first_count == 0 ? 0 : extra_keys_digest(std::span(keys.data(), first_count));
  const std::uint64_t later_extra = later_count == 0 ? 0 : extra_keys_digest(std::span(keys.data(), later_count));
  const std::size_t blocks = std::min(tokens.size() / block_size, max_blocks);
  chain_hash parent = chain_seed(lora_name);
  for (std::size_t i = 0; i < blocks; ++i) {
    parent = block_hash(parent, tokens.subspan(i * block_size, block_size), i == 0 ? first_extra : later_extra);
    out.push_back(parent);
  }
}

}  // namespace dplb::kv
