#include "kv_event_encoder.hpp"

#include <string_view>
#include <type_traits>
#include <variant>

#include "msgpack_writer.hpp"

namespace dplb::mock {
namespace {

constexpr std::string_view medium_gpu = "GPU";

class event_writer {
 public:
  event_writer(msgpack_writer& w, const kv_event_format& format) : w_(w), format_(format) {}

  void operator()(const sim::stored_blocks& e) {
    const bool salted = !e.cache_salt.empty();
    head("BlockStored", salted ? 9 : 8);
    key("block_hashes");
    hashes(e.hashes);
    key("parent_block_hash");
    if (e.parent) hash(*e.parent);
    else w_.nil();
    key("token_ids");
    w_.array(static_cast<std::uint32_t>(e.tokens.size()));
    for (const auto token : e.tokens) w_.uint(token);
    key("block_size");
    w_.uint(format_.block_size);
    key("lora_id");
    w_.nil();
    key("medium");
    w_.str(medium_gpu);
    key("lora_name");
    w_.nil();
    if (salted) {
      key("extra_keys");
      w_.array(static_cast<std::uint32_t>(e.hashes.size()));
      for (std::size_t i = 0; i < e.hashes.size(); ++i) {
        // The salt belongs to the prompt's first block: the run's first block only if it starts the chain.
        if (i == 0 && !e.parent) w_.array(1).str(e.cache_salt);
        else w_.nil();
      }
    }
  }

  void operator()(const sim::removed_blocks& e) {
    head("BlockRemoved", 3);
    key("block_hashes");
    hashes(e.hashes);
    key("medium");
    w_.str(medium_gpu);
  }

  void operator()(const sim::cache_cleared&) { head("AllBlocksCleared", 1); }

 private:
  bool as_map() const { return format_.encoding == kv_event_encoding::map; }

  // `fields` counts the type tag: an array of that many items, or a map of that many pairs.
  void head(std::string_view type, std::uint32_t fields) {
    if (as_map()) {
      w_.map(fields);
      w_.str("type");
    } else {
      w_.array(fields);
    }
    w_.str(type);
  }
  void key(std::string_view name) {
    if (as_map()) w_.str(name);
  }
  void hash(sim::block_hash h) {
    if (format_.int_hashes) {
      w_.uint(h);
    } else {
      const auto bytes = block_hash_bytes(h);
      w_.bin(std::string_view(bytes.data(), bytes.size()));
    }
  }
  void hashes(const std::vector<sim::block_hash>& hs) {
    w_.array(static_cast<std::uint32_t>(hs.size()));
    for (const auto h : hs) hash(h);
  }

  msgpack_writer& w_;
  const kv_event_format& format_;
};

}  // namespace

std::array<char, 32> block_hash_bytes(sim::block_hash hash) {
  std::array<char, 32> out{};
  std::uint64_t word = hash;
  for (std::size_t w = 0; w < 4; ++w) {
    for (std::size_t i = 0; i < 8; ++i) out[w * 8 + i] = static_cast<char>(static_cast<std::uint8_t>(word >> (56 - 8 * i)));
    word = support::mix64(hash ^ (w + 1));
  }
  return out;
}

std::string encode_event_batch(double ts, std::span<const sim::cache_event> events, std::int64_t dp_rank,
                               const kv_event_format& format) {
  std::string out;
  msgpack_writer w(out);
  const bool as_map = format.encoding == kv_event_encoding::map;
  if (as_map) w.map(3).str("ts");
  else w.array(3);
  w.float64(ts);
  if (as_map) w.str("events");
  w.array(static_cast<std::uint32_t>(events.size()));
  event_writer write_event(w, format);
  for (const auto& event : events) std::visit(write_event, event);
  if (as_map) w.str("data_parallel_rank");
  w.integer(dp_rank);
  return out;
}

}  // namespace dplb::mock
