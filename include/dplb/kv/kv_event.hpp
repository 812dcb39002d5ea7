#pragma once
// vLLM's KV-cache events as plain C++ values, and the decoder of one ZMQ message. An engine started with
// `--kv-events-config` publishes every change of its prefix cache on a ZMQ PUB socket, one publisher per
// DP rank; each message has three frames: a topic, an 8-byte big-endian sequence number, and a msgpack
// EventBatch `[ts, events, data_parallel_rank]` (a trailing nil left out) or, since vLLM 0.26, a map with
// those names as keys. Events come in two encodings as well: tagged arrays
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
//    extra_keys, group_idx, ...]
//   ["BlockRemoved", block_hashes, medium, group_idx, ...]
//   ["AllBlocksCleared"]
// and maps with a "type" key and the same names as keys. Trailing fields may be absent (their defaults
// below apply), and fields this decoder does not know are ignored.
//
// The decoder is pure (no I/O), never throws and never trusts a size from the wire: the payload, the
// events of a batch, the hashes and tokens of an event and every string are bounded by the constants
// below, and a size beyond them, or beyond the bytes actually present, is an error. Not thread-safe state:
// none; call it from any thread.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dplb/kv/chain_hash.hpp"

namespace dplb::kv {

// Bounds on what one message may make dplb allocate. Each is far above what a real engine sends in one
// batch (one engine step), and together they keep a hostile or broken publisher from costing more than
// max_decoded_bytes per message.
//
// 32 MiB of payload: a step that stores a 1M-token prompt sends about 5 MB of token ids (msgpack uint32);
// the subscriber sets ZMQ_MAXMSGSIZE to the same bound, so a larger message never reaches memory whole.
inline constexpr std::size_t max_payload_bytes = std::size_t{32} << 20;
// 65,536 events per batch: one step emits an event per request that filled blocks (max_num_seqs is 256 to
// 1,024 in practice) and one per evicted block.
inline constexpr std::size_t max_events_per_batch = std::size_t{1} << 16;
// 262,144 block hashes per event: a 4M-token prompt in 16-token blocks.
inline constexpr std::size_t max_hashes_per_event = std::size_t{1} << 18;
// 4M token ids per event (16 MiB decoded): the same 4M-token prompt.
inline constexpr std::size_t max_tokens_per_event = std::size_t{1} << 22;
// Tokens per block: vLLM's attention blocks are 16 to 256 tokens; hybrid models align larger ones (a few
// thousand). Beyond this an event is malformed.
inline constexpr std::size_t max_block_size = std::size_t{1} << 16;
// Bytes of one string field (type, medium, lora_name) and of an engine block hash given as bytes (32 for
// sha256): longer is malformed.
inline constexpr std::size_t max_string_bytes = 1024;
// 64 MiB of memory for one decoded message (its events, hashes, token ids, extra keys' digests and strings,
// counted as they are reserved), twice the payload bound: a message beyond it is refused whole. The bounds
// above are in items, and an item can be 1 byte on the wire and 8 once decoded (a msgpack fixint block
// hash), so a 32 MiB payload of them would decode to 256 MiB; a real batch decodes to at most 4/3 of its
// size (a 16-bit token id: 3 bytes on the wire, 4 decoded) plus its events' fixed part.
inline constexpr std::size_t max_decoded_bytes = std::size_t{64} << 20;

// The medium of vLLM's GPU prefix cache ("CPU" and others name offload tiers). Absent or nil means GPU.
inline constexpr std::string_view medium_gpu = "GPU";

// A block of the engine's cache was filled: `block_hashes.size()` full blocks, in chain order, extending
// `parent_block_hash` (none: they start a prompt). `token_ids` holds `block_size` ids per block, in order
// (the decoder checks the sizes agree).
struct block_stored {
  std::vector<engine_block_key> block_hashes;
  std::optional<engine_block_key> parent_block_hash;
  std::vector<token_id> token_ids;
  std::uint32_t block_size = 0;
  std::optional<std::int64_t> lora_id;
  std::optional<std::string> lora_name;
  std::string medium{medium_gpu};
  // Per block, the digest of its extra keys (0: none), when the event carries extra_keys (newer vLLM);
  // same size as block_hashes. See extra_keys_digest() for how a request computes the same digest.
  std::optional<std::vector<std::uint64_t>> extra_keys;
  // The KV cache group (hybrid models: full attention, sliding window, mamba); absent: the only one, 0.
  std::optional<std::int64_t> group_idx;
};

// Blocks were evicted from the engine's cache.
struct block_removed {
  std::vector<engine_block_key> block_hashes;
  std::string medium{medium_gpu};
  std::optional<std::int64_t> group_idx;
};

// The engine emptied its prefix cache (a reset).
struct all_blocks_cleared {};

using kv_event = std::variant<block_stored, block_removed, all_blocks_cleared>;

struct event_batch {
  double ts = 0;  // the engine's clock, seconds since the epoch
  std::vector<kv_event> events;
  std::optional<std::int64_t> dp_rank;  // data_parallel_rank, when the engine names it
};

struct decode_result {
  event_batch batch;
  // Empty when the batch was read (some of its events may still have been skipped); otherwise why the
  // whole message was refused (a static string), and `batch` holds nothing.
  std::string_view error;
  // Events of a read batch that were skipped: an unknown type, or a known one with a wrong shape (a field
  // of the wrong type, sizes that disagree, a bound exceeded). Each is an item of the events array read
  // whole, so the events after it are still read. The first such reason is kept.
  std::size_t unknown_type_events = 0;
  std::size_t malformed_events = 0;
  std::string_view first_skip_reason;

  bool ok() const { return error.empty(); }
  std::size_t skipped_events() const { return unknown_type_events + malformed_events; }
};

// Decodes one message's payload (its third frame), refusing it whole if it would decode to more than
// `max_decoded` bytes (a smaller bound: tests). Never throws.
decode_result decode_event_batch(std::span<const std::byte> payload, std::size_t max_decoded = max_decoded_bytes) noexcept;

// The second frame: a sequence number, 8 bytes big-endian, read as signed (a replay ends with -1). None
// when the frame is not 8 bytes long.
std::optional<std::int64_t> decode_sequence_frame(std::span<const std::byte> frame) noexcept;

}  // namespace dplb::kv
