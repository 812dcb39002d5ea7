#pragma once
// vLLM's KV-cache events on the wire: one EventBatch, the payload frame of one ZMQ message, written from
// the simulated cache's log (kv_block_pool.hpp: stored_blocks, removed_blocks, cache_cleared). Pure.
//
// The batch is `[ts, events, data_parallel_rank]` (vLLM before 0.26: msgspec array_like structs) or the
// map `{"ts":..,"events":[..],"data_parallel_rank":..}` (0.26 on), and each event likewise a tagged array
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name
//    (, extra_keys)]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
// or a map with "type" first and the same field names. lora_id and lora_name are nil (no LoRA), medium is
// "GPU". extra_keys only for a request with a cache_salt: per block, ["<salt>"] for the prompt's first
// block and nil for the others (vLLM's extra keys: the salt is mixed into the first block only).

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "kv_block_pool.hpp"

namespace dplb::mock {

enum class kv_event_encoding { array, map };

struct kv_event_format {
  kv_event_encoding encoding = kv_event_encoding::map;
  // Block hashes as msgpack unsigned integers (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); else as
  // 32-byte bins, the size of vLLM's default sha256 hashes (block_hash_bytes).
  bool int_hashes = false;
  std::uint32_t block_size = 16;
};

// The 32 bytes a block hash is sent as: its 8 bytes big-endian, then 24 bytes derived from it (a
// deterministic expansion, so that the bytes look like a digest and differ in every position).
std::array<char, 32> block_hash_bytes(sim::block_hash hash);

// The payload of one EventBatch: `ts` in seconds since the epoch, `dp_rank` the engine's index on its
// port (vLLM's data_parallel_rank).
std::string encode_event_batch(double ts, std::span<const sim::cache_event> events, std::int64_t dp_rank,
                               const kv_event_format& format);

}  // namespace dplb::mock
