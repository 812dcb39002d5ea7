// The KV-cache event decoder: vLLM's EventBatch in both encodings (tagged arrays, and maps with a "type"
// key), defaults for trailing fields that are absent, unknown fields and event types, and garbage of every
// kind refused as a value (never an exception, never an allocation beyond the bounds).
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/kv/kv_event.hpp"
#include "msgpack_writer.hpp"

using namespace dplb::kv;
using dplb::kv::test::msgpack_writer;

namespace {

std::span<const std::byte> as_bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

engine_block_key bytes_key(std::string_view s) { return engine_key_of_bytes(as_bytes(s)); }

// Written by Python's msgpack 1.0.3 (`msgpack.packb(..., use_bin_type=True)`, the encoding msgspec shares):
// [1700000000.5, [["BlockStored", [b"\x01"*32, b"\x02"*32], None, [1000..1007], 4, None, "GPU", None],
//                 ["BlockRemoved", [b"\x01"*32], "GPU"], ["AllBlocksCleared"]], 3]
constexpr char python_tagged_arrays[] =
    "\x93\xcb\x41\xd9\x54\xfc\x40\x20\x00\x00\x93\x98\xab\x42\x6c\x6f\x63\x6b\x53\x74\x6f\x72\x65\x64\x92\xc4\x20\x01\x01\x01\x01\x01"
    "\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\xc4\x20\x02\x02\x02"
    "\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\xc0\x98\xcd"
    "\x03\xe8\xcd\x03\xe9\xcd\x03\xea\xcd\x03\xeb\xcd\x03\xec\xcd\x03\xed\xcd\x03\xee\xcd\x03\xef\x04\xc0\xa3\x47\x50\x55\xc0\x93\xac"
    "\x42\x6c\x6f\x63\x6b\x52\x65\x6d\x6f\x76\x65\x64\x91\xc4\x20\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01"
    "\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\xa3\x47\x50\x55\x91\xb0\x41\x6c\x6c\x42\x6c\x6f\x63\x6b\x73\x43\x6c"
    "\x65\x61\x72\x65\x64\x03";

// Likewise: {"ts": 1700000000.5, "events": [{"type": "BlockStored", "block_hashes": [2**63 + 5, -7],
//   "parent_block_hash": 42, "token_ids": [1, 2, 3, 4, 70000, 6, 7, 8], "block_size": 4,
//   "lora_name": "adapter-a", "extra_keys": [["adapter-a", "salt"], ["adapter-a"]], "group_idx": 0}],
//   "data_parallel_rank": 1}
constexpr char python_maps[] =
    "\x83\xa2\x74\x73\xcb\x41\xd9\x54\xfc\x40\x20\x00\x00\xa6\x65\x76\x65\x6e\x74\x73\x91\x88\xa4\x74\x79\x70\x65\xab\x42\x6c\x6f\x63"
    "\x6b\x53\x74\x6f\x72\x65\x64\xac\x62\x6c\x6f\x63\x6b\x5f\x68\x61\x73\x68\x65\x73\x92\xcf\x80\x00\x00\x00\x00\x00\x00\x05\xf9\xb1"
    "\x70\x61\x72\x65\x6e\x74\x5f\x62\x6c\x6f\x63\x6b\x5f\x68\x61\x73\x68\x2a\xa9\x74\x6f\x6b\x65\x6e\x5f\x69\x64\x73\x98\x01\x02\x03"
    "\x04\xce\x00\x01\x11\x70\x06\x07\x08\xaa\x62\x6c\x6f\x63\x6b\x5f\x73\x69\x7a\x65\x04\xa9\x6c\x6f\x72\x61\x5f\x6e\x61\x6d\x65\xa9"
    "\x61\x64\x61\x70\x74\x65\x72\x2d\x61\xaa\x65\x78\x74\x72\x61\x5f\x6b\x65\x79\x73\x92\x92\xa9\x61\x64\x61\x70\x74\x65\x72\x2d\x61"
    "\xa4\x73\x61\x6c\x74\x91\xa9\x61\x64\x61\x70\x74\x65\x72\x2d\x61\xa9\x67\x72\x6f\x75\x70\x5f\x69\x64\x78\x00\xb2\x64\x61\x74\x61"
    "\x5f\x70\x61\x72\x61\x6c\x6c\x65\x6c\x5f\x72\x61\x6e\x6b\x01";

decode_result decode(const msgpack_writer& w) { return decode_event_batch(w.bytes()); }

// A batch [ts, [events...]] around events written by `write_events` (which writes `n` events).
template <class F>
msgpack_writer batch_of(std::uint32_t n, F write_events) {
  msgpack_writer w;
  w.array(2).float64(1.5).array(n);
  write_events(w);
  return w;
}

const block_stored& stored(const decode_result& r, std::size_t i) { return std::get<block_stored>(r.batch.events.at(i)); }

}  // namespace

TEST_CASE("kv decoder: a batch of tagged arrays written by Python's msgpack", "[kv]") {
  const auto r = decode_event_batch(as_bytes(std::string_view(python_tagged_arrays, sizeof python_tagged_arrays - 1)));
  REQUIRE(r.ok());
  CHECK(r.skipped_events() == 0);
  CHECK(r.batch.ts == 1700000000.5);
  REQUIRE(r.batch.dp_rank);
  CHECK(*r.batch.dp_rank == 3);
  REQUIRE(r.batch.events.size() == 3);
  const auto& s = stored(r, 0);
  CHECK(s.block_hashes == std::vector<engine_block_key>{bytes_key(std::string(32, '\x01')), bytes_key(std::string(32, '\x02'))});
  CHECK_FALSE(s.parent_block_hash);
  CHECK(s.token_ids == std::vector<token_id>{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007});
  CHECK(s.block_size == 4);
  CHECK_FALSE(s.lora_id);
  CHECK_FALSE(s.lora_name);
  CHECK(s.medium == "GPU");
  CHECK_FALSE(s.extra_keys);
  CHECK_FALSE(s.group_idx);
  const auto& removed = std::get<block_removed>(r.batch.events[1]);
  CHECK(removed.block_hashes == std::vector<engine_block_key>{bytes_key(std::string(32, '\x01'))});
  CHECK(removed.medium == "GPU");
  CHECK(std::holds_alternative<all_blocks_cleared>(r.batch.events[2]));

  // The tests' writer produces exactly these bytes, so the payloads it writes below are real ones too.
  msgpack_writer w;
  w.array(3).float64(1700000000.5).array(3);
  w.array(8).str("BlockStored").array(2).bin(std::string(32, '\x01')).bin(std::string(32, '\x02')).nil();
  w.uints(std::vector<int>{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007}).uint(4).nil().str("GPU").nil();
  w.array(3).str("BlockRemoved").array(1).bin(std::string(32, '\x01')).str("GPU");
  w.array(1).str("AllBlocksCleared");
  w.uint(3);
  const auto written = w.bytes();
  REQUIRE(written.size() == sizeof python_tagged_arrays - 1);
  CHECK(std::memcmp(written.data(), python_tagged_arrays, written.size()) == 0);
}

TEST_CASE("kv decoder: a batch of maps written by Python's msgpack, integer hashes, LoRA and extra keys", "[kv]") {
  const auto r = decode_event_batch(as_bytes(std::string_view(python_maps, sizeof python_maps - 1)));
  REQUIRE(r.ok());
  CHECK(r.skipped_events() == 0);
  CHECK(r.batch.ts == 1700000000.5);
  REQUIRE(r.batch.dp_rank);
  CHECK(*r.batch.dp_rank == 1);
  REQUIRE(r.batch.events.size() == 1);
  const auto& s = stored(r, 0);
  // 2^63 + 5 (a uint64) and -7 (a negative fixint): keyed by their 64-bit patterns.
  CHECK(s.block_hashes == std::vector<engine_block_key>{engine_key_of_int((1ULL << 63) + 5), engine_key_of_int(static_cast<std::uint64_t>(-7))});
  REQUIRE(s.parent_block_hash);
  CHECK(*s.parent_block_hash == engine_key_of_int(42));
  CHECK(s.token_ids == std::vector<token_id>{1, 2, 3, 4, 70000, 6, 7, 8});
  CHECK(s.block_size == 4);
  REQUIRE(s.lora_name);
  CHECK(*s.lora_name == "adapter-a");
  REQUIRE(s.extra_keys);
  const std::array<std::string_view, 2> first{"adapter-a", "salt"};
  const std::array<std::string_view, 1> second{"adapter-a"};
  CHECK(*s.extra_keys == std::vector<std::uint64_t>{extra_keys_digest(first), extra_keys_digest(second)});
  REQUIRE(s.group_idx);
  CHECK(*s.group_idx == 0);
  CHECK(s.medium == "GPU");
}

TEST_CASE("kv decoder: engine hashes as bytes and as integers never share a key", "[kv]") {
  std::string eight(8, '\0');
  CHECK(engine_key_of_bytes(as_bytes(eight)) != engine_key_of_int(0));
  CHECK(engine_key_of_int(1) != engine_key_of_int(2));
  CHECK(bytes_key("a") != bytes_key("b"));
}

TEST_CASE("kv decoder: absent trailing fields take their defaults, in both encodings", "[kv]") {
  const auto arrays = decode(batch_of(2, [](msgpack_writer& w) {
    w.array(5).str("BlockStored").array(1).uint(11).nil().uints(std::vector<int>{5, 6}).uint(2);
    w.array(2).str("BlockRemoved").array(1).uint(11);
  }));
  REQUIRE(arrays.ok());
  CHECK_FALSE(arrays.batch.dp_rank);
  REQUIRE(arrays.batch.events.size() == 2);
  const auto& s = stored(arrays, 0);
  CHECK(s.medium == "GPU");
  CHECK_FALSE(s.lora_id);
  CHECK_FALSE(s.lora_name);
  CHECK_FALSE(s.extra_keys);
  CHECK_FALSE(s.group_idx);
  CHECK(std::get<block_removed>(arrays.batch.events[1]).medium == "GPU");
  CHECK_FALSE(std::get<block_removed>(arrays.batch.events[1]).group_idx);

  msgpack_writer w;
  w.map(2).str("events").array(2);
  w.map(4).str("type").str("BlockStored").str("block_hashes").array(1).uint(11).str("token_ids").uints(std::vector<int>{5, 6});
  w.str("block_size").uint(2);
  w.map(2).str("block_hashes").array(1).uint(11).str("type").str("BlockRemoved");  // "type" last
  w.str("ts").uint(7);                                                                // ts as an integer, after events
  const auto maps = decode(w);
  REQUIRE(maps.ok());
  CHECK(maps.batch.ts == 7.0);
  CHECK_FALSE(maps.batch.dp_rank);
  REQUIRE(maps.batch.events.size() == 2);
  CHECK(stored(maps, 0).token_ids == s.token_ids);
  CHECK(stored(maps, 0).medium == "GPU");
  CHECK(std::get<block_removed>(maps.batch.events[1]).block_hashes == std::get<block_removed>(arrays.batch.events[1]).block_hashes);
}

TEST_CASE("kv decoder: nil in an optional field is the default", "[kv]") {
  const auto r = decode(batch_of(1, [](msgpack_writer& w) {
    w.array(10).str("BlockStored").array(1).uint(1).nil().uints(std::vector<int>{9}).uint(1);
    w.nil().nil().nil().nil().nil();  // lora_id, medium, lora_name, extra_keys, group_idx
  }));
  REQUIRE(r.ok());
  REQUIRE(r.batch.events.size() == 1);
  CHECK(stored(r, 0).medium == "GPU");
  CHECK_FALSE(stored(r, 0).extra_keys);
  CHECK_FALSE(stored(r, 0).group_idx);
}

TEST_CASE("kv decoder: unknown fields are ignored, in both encodings and in the batch", "[kv]") {
  msgpack_writer w;
  w.array(5).float64(2.0).array(2);
  // Three fields beyond group_idx, one of them nested.
  w.array(13).str("BlockStored").array(1).bin("h").nil().uints(std::vector<int>{1, 2}).uint(2).integer(-3).str("CPU");
  w.str("l").array(1).array(2).str("l").str("s").uint(1).map(1).str("k").array(2).uint(1).nil().str("x").float64(0.5);
  w.map(4).str("future").map(1).str("a").array(1).uint(1).str("type").str("BlockRemoved").str("block_hashes");
  w.array(1).bin("h").str("group_idx").uint(2);
  w.uint(0).str("future batch field").map(0);
  const auto r = decode(w);
  REQUIRE(r.ok());
  CHECK(r.skipped_events() == 0);
  REQUIRE(r.batch.events.size() == 2);
  const auto& s = stored(r, 0);
  CHECK(*s.lora_id == -3);
  CHECK(s.medium == "CPU");
  CHECK(*s.lora_name == "l");
  REQUIRE(s.extra_keys);
  const std::array<std::string_view, 2> ls{"l", "s"};
  CHECK((*s.extra_keys)[0] == extra_keys_digest(ls));
  CHECK(*s.group_idx == 1);
  const auto& removed = std::get<block_removed>(r.batch.events[1]);
  CHECK(removed.block_hashes == s.block_hashes);
  CHECK(*removed.group_idx == 2);
  CHECK(*r.batch.dp_rank == 0);

  msgpack_writer m;
  m.map(4).str("ts").float64(1).str("extra").array(2).uint(1).uint(2).str("events").array(1).array(1).str("AllBlocksCleared");
  m.str("data_parallel_rank").uint(5);
  const auto mr = decode(m);
  REQUIRE(mr.ok());
  CHECK(mr.batch.events.size() == 1);
  CHECK(*mr.batch.dp_rank == 5);
}

TEST_CASE("kv decoder: an unknown event type is skipped and counted, the events around it are read", "[kv]") {
  const auto r = decode(batch_of(4, [](msgpack_writer& w) {
    w.array(1).str("AllBlocksCleared");
    w.array(3).str("BlockMoved").array(1).uint(1).map(1).str("deep").array(1).nil();
    w.map(2).str("type").str("SomethingNew").str("block_hashes").str("not even an array");
    w.array(2).str("BlockRemoved").array(1).uint(4);
  }));
  REQUIRE(r.ok());
  CHECK(r.unknown_type_events == 2);
  CHECK(r.malformed_events == 0);
  CHECK(r.first_skip_reason == "unknown event type");
  REQUIRE(r.batch.events.size() == 2);
  CHECK(std::holds_alternative<all_blocks_cleared>(r.batch.events[0]));
  CHECK(std::holds_alternative<block_removed>(r.batch.events[1]));
}

TEST_CASE("kv decoder: an event of the wrong shape is skipped and counted, the events after it are read", "[kv]") {
  const auto tokens = std::vector<int>{1, 2, 3, 4};
  const auto r = decode(batch_of(10, [&](msgpack_writer& w) {
    w.array(5).str("BlockStored").array(1).uint(1).nil().uints(tokens).uint(3);           // 4 tokens for one block of 3
    w.array(5).str("BlockStored").array(2).uint(1).float64(2).nil().uints(tokens).uint(2);  // a hash that is a float
    w.array(5).str("BlockStored").array(1).uint(1).nil().array(1).integer(-1).uint(1);    // a negative token id
    w.array(5).str("BlockStored").array(1).uint(1).nil().array(1).uint(1ULL << 32).uint(1);  // a token id past 32 bits
    w.array(5).str("BlockStored").array(0).nil().array(0).uint(0);                          // block_size 0
    w.array(9).str("BlockStored").array(1).uint(1).nil().uints(std::vector<int>{1}).uint(1).nil().nil().nil();
    w.array(2).nil().nil();                                                                  // extra_keys: one per block, here none
    w.uint(17);                                                                              // neither an array nor a map
    w.map(1).str("block_hashes").array(0);                                                  // no "type"
    w.array(4).str("BlockStored").array(1).uint(1).nil().uints(std::vector<int>{1});       // no block_size
    w.array(2).str("BlockRemoved").array(1).uint(9);                                        // fine
  }));
  REQUIRE(r.ok());
  CHECK(r.malformed_events == 9);
  CHECK(r.unknown_type_events == 0);
  CHECK(r.first_skip_reason == "BlockStored token_ids is not block_size ids per block hash");
  REQUIRE(r.batch.events.size() == 1);
  CHECK(std::holds_alternative<block_removed>(r.batch.events[0]));
}

TEST_CASE("kv decoder: garbage is an error value, never an exception", "[kv]") {
  const std::vector<std::string_view> garbage{
      std::string_view(),                                            // empty
      std::string_view("\xc1", 1),                                   // the reserved byte
      "{\"ts\": 1, \"events\": []}",                                 // JSON
      "hello, world",                                                // text
      std::string_view("\x2a", 1),                                   // an integer
      std::string_view("\x91\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00", 10),  // [1.0]: no events
      std::string_view("\x92\xa1x\x90", 4),                          // ["x", []]: ts not a number
      std::string_view("\x92\x01\x01", 3),                           // [1, 1]: events not an array
      std::string_view("\x92\x01\x90\x00", 4),                       // [1, []] then a byte more
      std::string_view("\x93\x01\x90\xa1x", 5),                      // data_parallel_rank a string
      std::string_view("\x81\xa2ts\x01", 5),                         // a map without events
  };
  for (const auto g : garbage) {
    CAPTURE(std::string(g));
    const auto r = decode_event_batch(as_bytes(g));
    CHECK_FALSE(r.ok());
    CHECK(r.batch.events.empty());
    CHECK(r.skipped_events() == 0);
  }
}

TEST_CASE("kv decoder: every truncation of a real batch is refused", "[kv]") {
  for (const auto* payload : {python_tagged_arrays, python_maps}) {
    const std::size_t size = payload == python_tagged_arrays ? sizeof python_tagged_arrays - 1 : sizeof python_maps - 1;
    for (std::size_t cut = 0; cut < size; ++cut) {
      CAPTURE(cut);
      const auto r = decode_event_batch(as_bytes(std::string_view(payload, cut)));
      CHECK_FALSE(r.ok());
      CHECK(r.batch.events.empty());
    }
    CHECK(decode_event_batch(as_bytes(std::string_view(payload, size))).ok());
  }
}

TEST_CASE("kv decoder: sizes declared beyond the payload or the bounds are refused without allocating them", "[kv]") {
  // Declared counts and lengths of up to 4 G, with a few bytes behind them.
  const std::vector<std::string_view> liars{
      std::string_view("\x92\x01\xdd\xff\xff\xff\xff", 7),  // 4 G events
      std::string_view("\xdd\xff\xff\xff\xff\x01", 6),      // a batch of 4 G items
      std::string_view("\xdf\xff\xff\xff\xff\x01", 6),      // a batch map of 4 G pairs
      std::string_view("\x92\x01\x91\xdb\xff\xff\xff\xff", 8),  // an event that is a 4 GB string
  };
  for (const auto g : liars) {
    const auto r = decode_event_batch(as_bytes(g));
    CHECK_FALSE(r.ok());
  }
  // Inside an event: the event is skipped only if it can be skipped, which a lie makes impossible.
  msgpack_writer tokens;
  tokens.array(2).uint(1).array(1).array(5).str("BlockStored").array(1).uint(1).nil();
  tokens.byte(0xdd).be(0xffffffffu, 4).uint(1).uint(1);  // token_ids: 4 G declared, 2 present
  CHECK_FALSE(decode(tokens).ok());
  msgpack_writer hash;
  hash.array(2).uint(1).array(1).array(2).str("BlockRemoved").array(1).byte(0xc6).be(0xfffffff0u, 4).raw("abc");
  CHECK_FALSE(decode(hash).ok());

  // Present, but beyond the bounds: the batch, or the event, is refused.
  const auto many_events = decode(batch_of(max_events_per_batch + 1, [](msgpack_writer& w) {
    for (std::size_t i = 0; i <= max_events_per_batch; ++i) w.array(1).str("AllBlocksCleared");
  }));
  CHECK_FALSE(many_events.ok());
  const auto many_hashes = decode(batch_of(2, [](msgpack_writer& w) {
    w.array(2).str("BlockRemoved").array(static_cast<std::uint32_t>(max_hashes_per_event + 1));
    for (std::size_t i = 0; i <= max_hashes_per_event; ++i) w.uint(i % 100);
    w.array(1).str("AllBlocksCleared");
  }));
  REQUIRE(many_hashes.ok());
  CHECK(many_hashes.malformed_events == 1);
  CHECK(many_hashes.batch.events.size() == 1);
  const auto long_hash = decode(batch_of(1, [](msgpack_writer& w) {
    w.array(2).str("BlockRemoved").array(1).bin(std::string(max_string_bytes + 1, 'h'));
  }));
  REQUIRE(long_hash.ok());
  CHECK(long_hash.malformed_events == 1);
  std::vector<std::byte> huge(max_payload_bytes + 1, std::byte{0x90});
  CHECK(decode_event_batch(huge).error == "payload larger than max_payload_bytes");
}

TEST_CASE("kv decoder: deep nesting in an ignored field costs no stack", "[kv]") {
  // 100,000 nested arrays as an unknown trailing field of a BlockRemoved.
  msgpack_writer deep;
  deep.array(2).uint(1).array(1).array(5).str("BlockRemoved").array(0).nil().nil();
  for (int i = 0; i < 100000; ++i) deep.array(1);
  deep.nil();
  const auto r = decode(deep);
  REQUIRE(r.ok());
  CHECK(r.batch.events.size() == 1);
}

TEST_CASE("kv decoder: the sequence frame is 8 bytes big-endian, -1 ends a replay", "[kv]") {
  const std::array<std::byte, 8> seven{std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0},
                                       std::byte{0}, std::byte{0}, std::byte{1}, std::byte{2}};
  CHECK(decode_sequence_frame(seven) == 258);
  std::array<std::byte, 8> end{};
  end.fill(std::byte{0xff});
  CHECK(decode_sequence_frame(end) == -1);
  CHECK_FALSE(decode_sequence_frame(std::span(seven).first(7)));
  CHECK_FALSE(decode_sequence_frame({}));
}

TEST_CASE("kv decoder: a message that would decode beyond max_decoded_bytes is refused whole", "[kv]") {
  // 1-byte block hashes (msgpack fixints) are 8 bytes each once decoded: 40 removals of 262,144 of them are
  // 10 MiB on the wire, within every other bound, and would take 80 MiB.
  msgpack_writer w;
  constexpr std::uint32_t events = 40;
  w.array(2).float64(1.0e9).array(events + 1).array(1).str("AllBlocksCleared");
  for (std::uint32_t e = 0; e < events; ++e) {
    w.array(2).str("BlockRemoved").array(static_cast<std::uint32_t>(max_hashes_per_event));
    for (std::size_t i = 0; i < max_hashes_per_event; ++i) w.uint(i % 100);
  }
  const auto bytes = w.bytes();
  REQUIRE(bytes.size() < max_payload_bytes);
  REQUIRE(events * max_hashes_per_event * sizeof(engine_block_key) > max_decoded_bytes);
  const auto refused = decode_event_batch(bytes);
  CHECK(refused.error == "decoded size larger than max_decoded_bytes");
  CHECK(refused.batch.events.empty());
  // The same bound met by a smaller message: the count of every reservation is what is bounded.
  const std::size_t one_removal = max_hashes_per_event * sizeof(engine_block_key);
  const std::size_t fixed = (events + 1) * sizeof(kv_event);
  CHECK(decode_event_batch(bytes, fixed + events * one_removal).ok());
  CHECK_FALSE(decode_event_batch(bytes, fixed + events * one_removal - 1).ok());
}
