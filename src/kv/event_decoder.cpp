#include <cstring>

#include "dplb/kv/kv_event.hpp"
#include "msgpack_reader.hpp"

namespace dplb::kv {

namespace event_decoder_detail {

using msgpack::item;
using msgpack::kind;
using msgpack::reader;

enum class event_type { unknown, stored, removed, cleared };

event_type type_named(std::string_view name) {
  if (name == "BlockStored") return event_type::stored;
  if (name == "BlockRemoved") return event_type::removed;
  if (name == "AllBlocksCleared") return event_type::cleared;
  return event_type::unknown;
}

enum class field {
  ignored, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx
};

// The array encoding's positions after the tag (vLLM's field order, which only ever grows at the end).
constexpr field stored_fields[] = {field::block_hashes, field::parent_block_hash, field::token_ids,
                                   field::block_size,   field::lora_id,           field::medium,
                                   field::lora_name,    field::extra_keys,        field::group_idx};
constexpr field removed_fields[] = {field::block_hashes, field::medium, field::group_idx};

std::span<const field> fields_of(event_type t) {
  if (t == event_type::stored) return stored_fields;
  if (t == event_type::removed) return removed_fields;
  return {};
}

// A key of the map encoding, if the event type has that field.
field field_named(event_type t, std::string_view name) {
  for (const field f : fields_of(t)) {
    const std::string_view n = [f] {
      switch (f) {
        case field::block_hashes: return "block_hashes";
        case field::parent_block_hash: return "parent_block_hash";
        case field::token_ids: return "token_ids";
        case field::block_size: return "block_size";
        case field::lora_id: return "lora_id";
        case field::medium: return "medium";
        case field::lora_name: return "lora_name";
        case field::extra_keys: return "extra_keys";
        case field::group_idx: return "group_idx";
        case field::ignored: break;
      }
      return "";
    }();
    if (n == name) return f;
  }
  return field::ignored;
}

// Everything an event may carry, as read; made into a kv_event once the whole event was read.
struct event_fields {
  std::vector<engine_block_key> hashes;
  bool has_hashes = false;
  std::optional<engine_block_key> parent;
  std::vector<token_id> tokens;
  bool has_tokens = false;
  std::optional<std::int64_t> block_size;
  std::optional<std::int64_t> lora_id;
  std::optional<std::string> lora_name;
  std::string medium{medium_gpu};
  std::optional<std::vector<std::uint64_t>> extra_keys;
  std::optional<std::int64_t> group_idx;
};

// Each reader returns nullptr when it read its item, or why not (the position is then unspecified: the
// caller skips the whole event from its start).
using failure = const char*;

constexpr failure too_large_decoded = "decoded size larger than max_decoded_bytes";

// The memory a message decodes to, counted before each reservation (an event's vectors and strings, the
// batch's events). Kept even for an event later skipped: a bound on the most the message ever holds.
class decoded_budget {
 public:
  explicit decoded_budget(std::size_t limit) : left_(limit) {}
  // Takes `count` items of `each` bytes; false (and from then on exceeded()) when they do not fit.
  bool take(std::size_t count, std::size_t each) {
    if (exceeded_ || count > left_ / each) {
      exceeded_ = true;
      return false;
    }
    left_ -= count * each;
    return true;
  }
  bool exceeded() const { return exceeded_; }

 private:
  std::size_t left_;
  bool exceeded_ = false;
};

failure read_engine_hash(reader& r, engine_block_key& out) {
  item it;
  if (!r.next(it)) return "truncated block hash";
  if (it.type == kind::bin || it.type == kind::str) {
    if (it.data.size() > max_string_bytes) return "block hash longer than max_string_bytes";
    out = engine_key_of_bytes(it.data);
    return nullptr;
  }
  if (it.type == kind::integer) {
    out = engine_key_of_int(it.u);
    return nullptr;
  }
  return "block hash neither bytes nor an integer";
}

failure read_hashes(reader& r, std::vector<engine_block_key>& out, decoded_budget& budget) {
  item it;
  if (!r.next(it) || it.type != kind::array) return "block_hashes is not an array";
  if (it.count > max_hashes_per_event) return "more block hashes than max_hashes_per_event";
  if (!budget.take(it.count, sizeof(engine_block_key))) return too_large_decoded;
  out.clear();
  out.reserve(it.count);  // no more than the bytes left, and bounded
  for (std::uint32_t i = 0; i < it.count; ++i) {
    engine_block_key key = 0;
    if (const failure f = read_engine_hash(r, key)) return f;
    out.push_back(key);
  }
  return nullptr;
}

failure read_tokens(reader& r, std::vector<token_id>& out, decoded_budget& budget) {
  item it;
  if (!r.next(it) || it.type != kind::array) return "token_ids is not an array";
  if (it.count > max_tokens_per_event) return "more token ids than max_tokens_per_event";
  if (!budget.take(it.count, sizeof(token_id))) return too_large_decoded;
  out.clear();
  out.reserve(it.count);
  item t;
  for (std::uint32_t i = 0; i < it.count; ++i) {
    if (!r.next(t) || t.type != kind::integer || t.negative || t.u > UINT32_MAX) return "a token id is not a 32-bit unsigned integer";
    out.push_back(static_cast<token_id>(t.u));
  }
  return nullptr;
}

// An optional integer: nil leaves it absent.
failure read_optional_int(reader& r, std::optional<std::int64_t>& out, failure wrong) {
  item it;
  if (!r.next(it)) return wrong;
  if (it.type == kind::nil) {
    out.reset();
    return nullptr;
  }
  if (!it.fits_int64()) return wrong;
  out = it.as_int64();
  return nullptr;
}

failure read_optional_string(reader& r, std::optional<std::string>& out, failure wrong, decoded_budget& budget) {
  item it;
  if (!r.next(it)) return wrong;
  if (it.type == kind::nil) {
    out.reset();
    return nullptr;
  }
  if (it.type != kind::str || it.data.size() > max_string_bytes) return wrong;
  if (!budget.take(it.data.size(), 1)) return too_large_decoded;
  out.emplace(it.text());
  return nullptr;
}

// One block's extra keys: nil is none (0), anything else is digested as the walk of its items
// (chain_hash.hpp: detail::extra_keys_feed), without recursion.
failure read_extra_keys_entry(reader& r, std::uint64_t& out) {
  const std::size_t start = r.position();
  item it;
  if (!r.next(it)) return "truncated extra_keys";
  if (it.type == kind::nil) {
    out = 0;
    return nullptr;
  }
  r.seek(start);
  std::uint64_t d = detail::extra_keys_start;
  std::uint64_t pending = 1;
  while (pending > 0) {
    if (!r.next(it)) return "truncated extra_keys";
    --pending;
    switch (it.type) {
      case kind::nil: d = detail::extra_keys_feed(d, 'n', 0); break;
      case kind::boolean: d = detail::extra_keys_feed(d, 'b', it.flag ? 1 : 0); break;
      case kind::integer: d = detail::extra_keys_feed(d, it.negative ? 'j' : 'i', it.u); break;
      case kind::floating: {
        std::uint64_t bits = 0;
        std::memcpy(&bits, &it.f, sizeof bits);
        d = detail::extra_keys_feed(d, 'f', bits);
        break;
      }
      case kind::str: d = detail::extra_keys_feed(d, 's', it.data.size(), it.data); break;
      case kind::bin: d = detail::extra_keys_feed(d, 'y', it.data.size(), it.data); break;
      case kind::ext:
        d = detail::extra_keys_feed(d, 'x', (std::uint64_t{static_cast<std::uint8_t>(it.ext_type)} << 32) | it.data.size(),
                                    it.data);
        break;
      case kind::array:
        d = detail::extra_keys_feed(d, 'a', it.count);
        pending += it.count;
        break;
      case kind::map:
        d = detail::extra_keys_feed(d, 'm', it.count);
        pending += 2ull * it.count;
        break;
    }
  }
  out = detail::extra_keys_finish(d);
  return nullptr;
}

failure read_field(reader& r, field f, event_fields& e, decoded_budget& budget) {
  item it;
  switch (f) {
    case field::ignored: return r.skip() ? nullptr : "truncated event";
    case field::block_hashes:
      e.has_hashes = true;
      return read_hashes(r, e.hashes, budget);
    case field::parent_block_hash: {
      const std::size_t start = r.position();
      if (!r.next(it)) return "truncated parent_block_hash";
      if (it.type == kind::nil) {
        e.parent.reset();
        return nullptr;
      }
      r.seek(start);
      engine_block_key key = 0;
      if (const failure fail = read_engine_hash(r, key)) return fail;
      e.parent = key;
      return nullptr;
    }
    case field::token_ids:
      e.has_tokens = true;
      return read_tokens(r, e.tokens, budget);
    case field::block_size:
      if (!r.next(it) || !it.fits_int64() || it.as_int64() < 1 || it.as_int64() > std::int64_t{max_block_size})
        return "block_size is not an integer in [1, max_block_size]";
      e.block_size = it.as_int64();
      return nullptr;
    case field::lora_id: return read_optional_int(r, e.lora_id, "lora_id is neither an integer nor nil");
    case field::medium: {
      std::optional<std::string> medium;
      if (const failure fail = read_optional_string(r, medium, "medium is neither a string nor nil", budget)) return fail;
      e.medium = medium ? std::move(*medium) : std::string(medium_gpu);
      return nullptr;
    }
    case field::lora_name: return read_optional_string(r, e.lora_name, "lora_name is neither a string nor nil", budget);
    case field::extra_keys: {
      if (!r.next(it)) return "truncated extra_keys";
      if (it.type == kind::nil) {
        e.extra_keys.reset();
        return nullptr;
      }
      if (it.type != kind::array) return "extra_keys is neither an array nor nil";
      if (it.count > max_hashes_per_event) return "more extra_keys than max_hashes_per_event";
      if (!budget.take(it.count, sizeof(std::uint64_t))) return too_large_decoded;
      std::vector<std::uint64_t> digests;
      digests.reserve(it.count);
      for (std::uint32_t i = 0; i < it.count; ++i) {
        std::uint64_t d = 0;
        if (const failure fail = read_extra_keys_entry(r, d)) return fail;
        digests.push_back(d);
      }
      e.extra_keys = std::move(digests);
      return nullptr;
    }
    case field::group_idx: return read_optional_int(r, e.group_idx, "group_idx is neither an integer nor nil");
  }
  return "unknown field";
}

// Makes the event of a known type from its fields, or says why its shape is wrong.
failure make_event(event_type t, event_fields& e, kv_event& out) {
  if (t == event_type::cleared) {
    out = all_blocks_cleared{};
    return nullptr;
  }
  if (!e.has_hashes) return "no block_hashes";
  if (t == event_type::removed) {
    out = block_removed{std::move(e.hashes), std::move(e.medium), e.group_idx};
    return nullptr;
  }
  if (!e.has_tokens) return "BlockStored without token_ids";
  if (!e.block_size) return "BlockStored without block_size";
  // token_ids holds block_size ids per stored block: anything else cannot be cut into the blocks named.
  if (e.tokens.size() != e.hashes.size() * static_cast<std::size_t>(*e.block_size))
    return "BlockStored token_ids is not block_size ids per block hash";
  if (e.extra_keys && e.extra_keys->size() != e.hashes.size())
    return "BlockStored extra_keys is not one entry per block hash";
  block_stored s;
  s.block_hashes = std::move(e.hashes);
  s.parent_block_hash = e.parent;
  s.token_ids = std::move(e.tokens);
  s.block_size = static_cast<std::uint32_t>(*e.block_size);
  s.lora_id = e.lora_id;
  s.lora_name = std::move(e.lora_name);
  s.medium = std::move(e.medium);
  s.extra_keys = std::move(e.extra_keys);
  s.group_idx = e.group_idx;
  out = std::move(s);
  return nullptr;
}

enum class event_outcome { decoded, unknown_type, malformed };

// Reads one event at the reader's position. On anything but `decoded`, the caller rewinds to the event's
// start and skips it whole.
event_outcome read_event(reader& r, kv_event& out, failure& why, decoded_budget& budget) {
  item head;
  if (!r.next(head)) {
    why = "truncated event";
    return event_outcome::malformed;
  }
  event_fields e;
  if (head.type == kind::array) {
    item tag;
    if (head.count == 0 || !r.next(tag) || tag.type != kind::str) {
      why = "event array without a type name first";
      return event_outcome::malformed;
    }
    const event_type t = type_named(tag.text());
    if (t == event_type::unknown) {
      why = "unknown event type";
      return event_outcome::unknown_type;
    }
    const auto fields = fields_of(t);
    for (std::uint32_t i = 1; i < head.count; ++i) {
      const field f = i - 1 < fields.size() ? fields[i - 1] : field::ignored;
      if ((why = read_field(r, f, e, budget))) return event_outcome::malformed;
    }
    why = make_event(t, e, out);
    return why ? event_outcome::malformed : event_outcome::decoded;
  }
  if (head.type == kind::map) {
    // The "type" key may come anywhere: find it first, then read the fields that type has.
    const std::size_t fields_start = r.position();
    event_type t = event_type::unknown;
    bool typed = false;
    item key;
    for (std::uint32_t i = 0; i < head.count; ++i) {
      if (!r.next(key)) {
        why = "truncated event";
        return event_outcome::malformed;
      }
      if (key.type == kind::str && key.text() == "type") {
        item value;
        if (!r.next(value) || value.type != kind::str) {
          why = "event type is not a string";
          return event_outcome::malformed;
        }
        t = type_named(value.text());
        typed = true;
      } else if (!r.skip()) {
        why = "truncated event";
        return event_outcome::malformed;
      }
    }
    if (!typed) {
      why = "event map without a \"type\"";
      return event_outcome::malformed;
    }
    if (t == event_type::unknown) {
      why = "unknown event type";
      return event_outcome::unknown_type;
    }
    r.seek(fields_start);
    for (std::uint32_t i = 0; i < head.count; ++i) {
      if (!r.next(key)) {
        why = "truncated event";
        return event_outcome::malformed;
      }
      const field f = key.type == kind::str ? field_named(t, key.text()) : field::ignored;
      if ((why = read_field(r, f, e, budget))) return event_outcome::malformed;
    }
    why = make_event(t, e, out);
    return why ? event_outcome::malformed : event_outcome::decoded;
  }
  why = "event is neither an array nor a map";
  return event_outcome::malformed;
}

failure read_events(reader& r, decode_result& result, decoded_budget& budget) {
  item it;
  if (!r.next(it) || it.type != kind::array) return "events is not an array";
  if (it.count > max_events_per_batch) return "more events than max_events_per_batch";
  if (!budget.take(it.count, sizeof(kv_event))) return too_large_decoded;
  auto& events = result.batch.events;
  events.clear();
  events.reserve(it.count);
  for (std::uint32_t i = 0; i < it.count; ++i) {
    const std::size_t start = r.position();
    kv_event event;
    failure why = nullptr;
    const event_outcome outcome = read_event(r, event, why, budget);
    if (outcome == event_outcome::decoded) {
      events.push_back(std::move(event));
      continue;
    }
    if (budget.exceeded()) return too_large_decoded;  // the whole message, not one event: it is hostile
    (outcome == event_outcome::unknown_type ? result.unknown_type_events : result.malformed_events) += 1;
    if (result.first_skip_reason.empty()) result.first_skip_reason = why;
    // Skipped whole: the events after it are read as usual. If it cannot even be skipped, the payload is
    // cut short, and the batch with it.
    r.seek(start);
    if (!r.skip()) return "truncated events";
  }
  return nullptr;
}

failure read_ts(reader& r, double& ts) {
  item it;
  if (!r.next(it)) return "truncated ts";
  if (it.type == kind::floating) ts = it.f;
  else if (it.type == kind::integer) ts = it.negative ? static_cast<double>(it.as_int64()) : static_cast<double>(it.u);
  else return "ts is not a number";
  return nullptr;
}

failure read_batch(reader& r, decode_result& result, decoded_budget& budget) {
  item head;
  if (!r.next(head)) return "not msgpack";
  if (head.type == kind::array) {
    if (head.count < 2) return "batch array shorter than [ts, events]";
    if (const failure f = read_ts(r, result.batch.ts)) return f;
    if (const failure f = read_events(r, result, budget)) return f;
    if (head.count >= 3 && read_optional_int(r, result.batch.dp_rank, "data_parallel_rank is neither an integer nor nil"))
      return "data_parallel_rank is neither an integer nor nil";
    if (head.count > 3 && !r.skip(head.count - 3)) return "truncated batch";
    return nullptr;
  }
  if (head.type == kind::map) {
    bool has_events = false;
    item key;
    for (std::uint32_t i = 0; i < head.count; ++i) {
      if (!r.next(key)) return "truncated batch";
      const std::string_view name = key.type == kind::str ? key.text() : std::string_view{};
      failure f = nullptr;
      if (name == "ts") f = read_ts(r, result.batch.ts);
      else if (name == "events") {
        f = read_events(r, result, budget);
        has_events = true;
      } else if (name == "data_parallel_rank")
        f = read_optional_int(r, result.batch.dp_rank, "data_parallel_rank is neither an integer nor nil");
      else if (!r.skip())
        f = "truncated batch";
      if (f) return f;
    }
    if (!has_events) return "batch map without \"events\"";
    return nullptr;
  }
  return "batch is neither an array nor a map";
}

}  // namespace event_decoder_detail

decode_result decode_event_batch(std::span<const std::byte> payload, std::size_t max_decoded) noexcept {
  decode_result result;
  if (payload.size() > max_payload_bytes) {
    result.error = "payload larger than max_payload_bytes";
    return result;
  }
  try {
    event_decoder_detail::reader r(payload);
    event_decoder_detail::decoded_budget budget(max_decoded);
    if (const char* error = event_decoder_detail::read_batch(r, result, budget)) result.error = error;
    else if (!r.at_end()) result.error = "bytes after the batch";
  } catch (...) {
    // Every size is bounded before anything is reserved, so only a machine already out of memory gets here
    // (std::bad_alloc: nothing else in the decoder throws).
    result.error = "out of memory";
  }
  if (!result.ok()) {
    result.batch = event_batch{};
    result.unknown_type_events = 0;
    result.malformed_events = 0;
    result.first_skip_reason = {};
  }
  return result;
}

std::optional<std::int64_t> decode_sequence_frame(std::span<const std::byte> frame) noexcept {
  if (frame.size() != 8) return std::nullopt;
  std::uint64_t n = 0;
  for (const std::byte b : frame) n = (n << 8) | static_cast<std::uint8_t>(b);
  return static_cast<std::int64_t>(n);
}

}  // namespace dplb::kv
