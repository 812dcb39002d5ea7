// vLLM's KV-cache events from the simulated cache: the msgpack writer (byte-exact against encodings
// Python's msgpack writes), the cache's log of stored and removed blocks, the EventBatch encoder (read
// back with dplb's own decoder, the consumer these messages are for), the replay buffer's bound, the
// token ids /tokenize answers, and the flags and admin routes.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "admin_api.hpp"
#include "batch_scheduler.hpp"
#include "dplb/kv/chain_hash.hpp"
#include "dplb/kv/kv_event.hpp"
#include "kv_block_pool.hpp"
#include "kv_event_encoder.hpp"
#include "kv_replay_buffer.hpp"
#include "mock_options.hpp"
#include "msgpack_writer.hpp"
#include "openai_api.hpp"

using namespace dplb::mock;
using sim::block_hash;
using sim::block_id;
using sim::token_id;
using json = nlohmann::json;

namespace {

// Bytes as hex pairs, for readable failures.
std::string hex(const std::string& bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (!out.empty()) out += ' ';
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

template <class Write>
std::string packed(Write write) {
  std::string out;
  msgpack_writer w(out);
  write(w);
  return hex(out);
}

std::vector<token_id> tokens(token_id first, std::size_t count) {
  std::vector<token_id> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A request's chain as the session builds it with events on: 16 tokens a block, tokens kept.
sim::chain_builder chain_of(const std::vector<token_id>& t, std::string_view salt = {}) {
  sim::chain_builder b(16, salt, true);
  for (const auto token : t) b.add(token);
  return b;
}

sim::kv_cache_config recording_cache(std::uint32_t blocks) {
  sim::kv_cache_config c;
  c.block_size = 16;
  c.num_blocks = blocks;
  c.record_events = true;
  return c;
}

dplb::kv::decode_result decode(const std::string& payload) {
  return dplb::kv::decode_event_batch(std::as_bytes(std::span(payload.data(), payload.size())));
}

}  // namespace

TEST_CASE("msgpack writer: the smallest encoding of each value, byte for byte", "[kv-events][msgpack]") {
  // Expected bytes as Python's msgpack.packb writes them (msgspec writes the same).
  CHECK(packed([](auto& w) { w.nil().boolean(true).boolean(false); }) == "c0 c3 c2");
  CHECK(packed([](auto& w) { w.uint(0).uint(127).uint(128).uint(255); }) == "00 7f cc 80 cc ff");
  CHECK(packed([](auto& w) { w.uint(256).uint(65535); }) == "cd 01 00 cd ff ff");
  CHECK(packed([](auto& w) { w.uint(65536).uint(4294967295ULL); }) == "ce 00 01 00 00 ce ff ff ff ff");
  CHECK(packed([](auto& w) { w.uint(4294967296ULL); }) == "cf 00 00 00 01 00 00 00 00");
  CHECK(packed([](auto& w) { w.uint(UINT64_MAX); }) == "cf ff ff ff ff ff ff ff ff");
  CHECK(packed([](auto& w) { w.integer(5).integer(-1).integer(-32); }) == "05 ff e0");
  CHECK(packed([](auto& w) { w.integer(-33).integer(-128); }) == "d0 df d0 80");
  CHECK(packed([](auto& w) { w.integer(-129).integer(-32768); }) == "d1 ff 7f d1 80 00");
  CHECK(packed([](auto& w) { w.integer(-32769); }) == "d2 ff ff 7f ff");
  CHECK(packed([](auto& w) { w.integer(-2147483649LL); }) == "d3 ff ff ff ff 7f ff ff ff");
  CHECK(packed([](auto& w) { w.integer(300); }) == "cd 01 2c");
  CHECK(packed([](auto& w) { w.float64(1.5); }) == "cb 3f f8 00 00 00 00 00 00");
  CHECK(packed([](auto& w) { w.str("").str("GPU"); }) == "a0 a3 47 50 55");
  CHECK(packed([](auto& w) { w.bin("ab"); }) == "c4 02 61 62");
  CHECK(packed([](auto& w) { w.array(0).array(15).map(1); }) == "90 9f 81");
  CHECK(packed([](auto& w) { w.array(16).map(16); }) == "dc 00 10 de 00 10");
  CHECK(packed([](auto& w) { w.array(65536).map(65536); }) == "dd 00 01 00 00 df 00 01 00 00");
  // Headers of longer strings and bins: str 8 from 32 bytes, 16 from 256; bin 16 from 256.
  CHECK(packed([](auto& w) { w.str(std::string(32, 'x')); }).substr(0, 5) == "d9 20");
  CHECK(packed([](auto& w) { w.str(std::string(256, 'x')); }).substr(0, 8) == "da 01 00");
  CHECK(packed([](auto& w) { w.str(std::string(65536, 'x')); }).substr(0, 14) == "db 00 01 00 00");
  CHECK(packed([](auto& w) { w.bin(std::string(256, 'x')); }).substr(0, 8) == "c5 01 00");
  CHECK(packed([](auto& w) { w.bin(std::string(65536, 'x')); }).substr(0, 14) == "c6 00 01 00 00");
  // {"ts": 1.5} as Python writes it.
  CHECK(packed([](auto& w) { w.map(1).str("ts").float64(1.5); }) == "81 a2 74 73 cb 3f f8 00 00 00 00 00 00");
}

TEST_CASE("token ids: word tokens fit 31 bits, the generated token is the word tok", "[kv-events][tokens]") {
  for (const char* word : {"a", "hello", "tok", "a-much-longer-word-than-the-others"}) {
    CHECK(sim::word_token(word) < (1U << 31));
  }
  CHECK(sim::generated_token == sim::word_token("tok"));
  CHECK(sim::word_token("a") != sim::word_token("b"));
}

TEST_CASE("block pool log: a run of newly named blocks is one stored record with its tokens and parent",
          "[kv-events][kv]") {
  sim::kv_block_pool pool(recording_cache(8));
  const auto t = tokens(100, 48);
  const auto chain = chain_of(t);
  REQUIRE(chain.chain().size() == 3);
  std::vector<block_id> blocks;
  REQUIRE(pool.allocate(3, blocks));
  pool.name_chain(blocks, chain, 0, 2);
  pool.name_chain(blocks, chain, 2, 3);
  const auto events = pool.take_events();
  REQUIRE(events.size() == 2);
  const auto& first = std::get<sim::stored_blocks>(events[0]);
  CHECK(first.hashes == std::vector<block_hash>{chain.chain()[0], chain.chain()[1]});
  CHECK_FALSE(first.parent);  // the prompt's first block
  CHECK(first.tokens == std::vector<token_id>(t.begin(), t.begin() + 32));
  const auto& second = std::get<sim::stored_blocks>(events[1]);
  CHECK(second.hashes == std::vector<block_hash>{chain.chain()[2]});
  REQUIRE(second.parent);
  CHECK(*second.parent == chain.chain()[1]);
  CHECK(second.tokens == std::vector<token_id>(t.begin() + 32, t.end()));
  CHECK(pool.take_events().empty());  // taken
}

TEST_CASE("block pool log: a block whose chain is cached elsewhere stays unnamed and splits the run",
          "[kv-events][kv]") {
  sim::kv_block_pool pool(recording_cache(8));
  const auto t = tokens(0, 48);
  const auto chain = chain_of(t);
  std::vector<block_id> a;
  REQUIRE(pool.allocate(2, a));
  pool.name_chain(a, chain, 1, 2);  // block 1's chain is cached under a[1]
  pool.take_events();
  std::vector<block_id> b;
  REQUIRE(pool.allocate(3, b));
  pool.name_chain(b, chain, 0, 3);  // 0 and 2 get names, 1 does not: two runs
  const auto events = pool.take_events();
  REQUIRE(events.size() == 2);
  CHECK(std::get<sim::stored_blocks>(events[0]).hashes == std::vector<block_hash>{chain.chain()[0]});
  const auto& later = std::get<sim::stored_blocks>(events[1]);
  CHECK(later.hashes == std::vector<block_hash>{chain.chain()[2]});
  CHECK(later.parent == chain.chain()[1]);
}

TEST_CASE("block pool log: eviction records the names lost, before the stores that reuse the blocks",
          "[kv-events][kv]") {
  sim::kv_block_pool pool(recording_cache(2));
  const auto old_chain = chain_of(tokens(0, 32));
  std::vector<block_id> a;
  REQUIRE(pool.allocate(2, a));
  pool.name_chain(a, old_chain, 0, 2);
  pool.release(a);  // free, still cached: the tail first in the free queue
  pool.take_events();
  const auto new_chain = chain_of(tokens(1000, 32));
  std::vector<block_id> b;
  REQUIRE(pool.allocate(2, b));
  pool.name_chain(b, new_chain, 0, 2);
  const auto events = pool.take_events();
  REQUIRE(events.size() == 2);
  // Freed last block first: the tail leaves the free queue first.
  CHECK(std::get<sim::removed_blocks>(events[0]).hashes ==
        std::vector<block_hash>{old_chain.chain()[1], old_chain.chain()[0]});
  CHECK(std::get<sim::stored_blocks>(events[1]).hashes == new_chain.chain());
  // Unnamed blocks evicted say nothing.
  pool.release(b);
  pool.reset_prefix_cache();
  const auto cleared = pool.take_events();
  REQUIRE(cleared.size() == 1);
  CHECK(std::holds_alternative<sim::cache_cleared>(cleared[0]));
  CHECK(pool.cached_blocks() == 0);
  std::vector<block_id> c;
  REQUIRE(pool.allocate(2, c));
  CHECK(pool.take_events().empty());
}

TEST_CASE("block pool log: nothing is recorded unless asked, nor without prefix caching", "[kv-events][kv]") {
  auto quiet = recording_cache(4);
  quiet.record_events = false;
  sim::kv_block_pool pool(quiet);
  const auto chain = chain_of(tokens(0, 16));
  std::vector<block_id> a;
  REQUIRE(pool.allocate(1, a));
  pool.name_chain(a, chain, 0, 1);
  CHECK(pool.cached_blocks() == 1);
  CHECK(pool.take_events().empty());

  auto uncached = recording_cache(4);
  uncached.prefix_caching = false;
  sim::kv_block_pool off(uncached);
  std::vector<block_id> b;
  REQUIRE(off.allocate(1, b));
  off.name_chain(b, chain, 0, 1);
  CHECK(off.take_events().empty());
}

TEST_CASE("cache_salt: salted chains share no block with unsalted ones or other salts", "[kv-events][kv]") {
  const auto t = tokens(0, 32);
  const auto plain = chain_of(t);
  const auto salted = chain_of(t, "s1");
  const auto other = chain_of(t, "s2");
  CHECK(plain.chain()[0] != salted.chain()[0]);
  CHECK(salted.chain()[0] != other.chain()[0]);
  CHECK(salted.chain() == chain_of(t, "s1").chain());
  CHECK(salted.cache_salt() == "s1");
}

TEST_CASE("scheduler: a prompt's blocks are stored when scheduled, output blocks as they fill",
          "[kv-events][kv]") {
  sim::engine_config config;
  config.max_num_batched_tokens = 0;
  config.kv = recording_cache(64);
  sim::batch_scheduler s(config);
  const auto t = tokens(7, 40);  // 2 full blocks and 8 tokens
  s.submit(1, t.size(), 10, chain_of(t));
  s.begin_step();
  auto events = s.take_kv_events();
  REQUIRE(events.size() == 1);
  const auto& prompt = std::get<sim::stored_blocks>(events[0]);
  CHECK(prompt.hashes.size() == 2);
  CHECK(prompt.tokens == std::vector<token_id>(t.begin(), t.begin() + 32));
  std::vector<sim::token_event> out;
  s.end_step(1, out);
  // 8 prompt tokens + 8 generated fill the third block: named when the step computing it is scheduled.
  std::vector<sim::stored_blocks> later;
  for (int i = 0; i < 9 && s.has_work(); ++i) {
    s.begin_step();
    for (auto& e : s.take_kv_events()) later.push_back(std::get<sim::stored_blocks>(e));
    s.end_step(1, out);
  }
  REQUIRE(later.size() == 1);
  CHECK(later[0].parent == prompt.hashes.back());
  std::vector<token_id> third(t.begin() + 32, t.end());
  third.insert(third.end(), 8, sim::generated_token);
  CHECK(later[0].tokens == third);
}

TEST_CASE("encoder: both encodings decode in dplb to the events the cache recorded", "[kv-events][encoder]") {
  const auto encoding = GENERATE(kv_event_encoding::map, kv_event_encoding::array);
  const bool int_hashes = GENERATE(false, true);
  const kv_event_format format{encoding, int_hashes, 16};
  const auto t = tokens(1, 32);
  std::vector<sim::cache_event> events;
  events.push_back(sim::removed_blocks{{11, 12}});
  events.push_back(sim::stored_blocks{{21, 22}, std::nullopt, t, ""});
  events.push_back(sim::stored_blocks{{23}, block_hash{22}, tokens(100, 16), ""});
  events.push_back(sim::cache_cleared{});
  const auto payload = encode_event_batch(1712345678.25, events, 3, format);
  const auto decoded = decode(payload);
  REQUIRE(decoded.ok());
  CHECK(decoded.skipped_events() == 0);
  CHECK(decoded.batch.ts == 1712345678.25);
  CHECK(decoded.batch.dp_rank == 3);
  REQUIRE(decoded.batch.events.size() == 4);
  const auto key = [&](block_hash h) {
    if (int_hashes) return dplb::kv::engine_key_of_int(h);
    const auto bytes = block_hash_bytes(h);
    return dplb::kv::engine_key_of_bytes(std::as_bytes(std::span(bytes)));
  };
  const auto& removed = std::get<dplb::kv::block_removed>(decoded.batch.events[0]);
  CHECK(removed.block_hashes == std::vector<std::uint64_t>{key(11), key(12)});
  CHECK(removed.medium == "GPU");
  const auto& stored = std::get<dplb::kv::block_stored>(decoded.batch.events[1]);
  CHECK(stored.block_hashes == std::vector<std::uint64_t>{key(21), key(22)});
  CHECK_FALSE(stored.parent_block_hash);
  CHECK(stored.token_ids == t);
  CHECK(stored.block_size == 16);
  CHECK_FALSE(stored.lora_id);
  CHECK_FALSE(stored.lora_name);
  CHECK(stored.medium == "GPU");
  CHECK_FALSE(stored.extra_keys);  // no salt: none
  const auto& next = std::get<dplb::kv::block_stored>(decoded.batch.events[2]);
  CHECK(next.parent_block_hash == key(22));
  CHECK(std::holds_alternative<dplb::kv::all_blocks_cleared>(decoded.batch.events[3]));
}

TEST_CASE("encoder: a salted prompt's first block carries [salt] in extra_keys, the others nil",
          "[kv-events][encoder]") {
  const auto encoding = GENERATE(kv_event_encoding::map, kv_event_encoding::array);
  std::vector<sim::cache_event> events;
  events.push_back(sim::stored_blocks{{1, 2}, std::nullopt, tokens(0, 32), "salt-a"});
  events.push_back(sim::stored_blocks{{3}, block_hash{2}, tokens(32, 16), "salt-a"});
  const auto decoded = decode(encode_event_batch(1.0, events, 0, {encoding, false, 16}));
  REQUIRE(decoded.ok());
  REQUIRE(decoded.batch.events.size() == 2);
  const std::string_view salt[] = {"salt-a"};
  const auto& head = std::get<dplb::kv::block_stored>(decoded.batch.events[0]);
  REQUIRE(head.extra_keys);
  CHECK(*head.extra_keys == std::vector<std::uint64_t>{dplb::kv::extra_keys_digest(salt), 0});
  const auto& tail = std::get<dplb::kv::block_stored>(decoded.batch.events[1]);
  REQUIRE(tail.extra_keys);
  CHECK(*tail.extra_keys == std::vector<std::uint64_t>{0});
}

TEST_CASE("encoder: the exact bytes of a small array-encoded batch", "[kv-events][encoder]") {
  // [1.5, [["AllBlocksCleared"], ["BlockRemoved", [7], "GPU"]], 2] as msgspec writes it (array_like).
  std::vector<sim::cache_event> events;
  events.emplace_back(sim::cache_cleared{});
  events.emplace_back(sim::removed_blocks{{7}});
  const auto payload = encode_event_batch(1.5, events, 2, {kv_event_encoding::array, true, 16});
  CHECK(hex(payload) ==
        "93 cb 3f f8 00 00 00 00 00 00 92 91 b0 41 6c 6c 42 6c 6f 63 6b 73 43 6c 65 61 72 65 64 "
        "93 ac 42 6c 6f 63 6b 52 65 6d 6f 76 65 64 91 07 a3 47 50 55 02");
  // Bin hashes are 32 bytes: the hash's 8 bytes big-endian first.
  const auto bytes = block_hash_bytes(0x0102030405060708ULL);
  CHECK(hex(std::string(bytes.data(), 8)) == "01 02 03 04 05 06 07 08");
  CHECK(block_hash_bytes(1) != block_hash_bytes(2));
}

TEST_CASE("replay buffer: keeps the last N batches, answers those from a sequence number on",
          "[kv-events][replay]") {
  kv_replay_buffer buffer(3);
  for (std::int64_t seq = 0; seq < 5; ++seq) buffer.push(seq, "p" + std::to_string(seq));
  CHECK(buffer.size() == 3);
  std::vector<std::int64_t> seen;
  buffer.for_each_since(0, [&](const kv_replay_buffer::entry& e) { seen.push_back(e.seq); });
  CHECK(seen == std::vector<std::int64_t>{2, 3, 4});
  seen.clear();
  buffer.for_each_since(4, [&](const kv_replay_buffer::entry& e) {
    seen.push_back(e.seq);
    CHECK(e.payload == "p4");
  });
  CHECK(seen == std::vector<std::int64_t>{4});
  kv_replay_buffer none(0);
  none.push(0, "x");
  CHECK(none.size() == 0);
}

TEST_CASE("/tokenize: the ids completions and chat prefill, shared with their block chains",
          "[kv-events][tokenize]") {
  const auto body = [](const json& j) {
    const auto answer = tokenize_request("application/json", j.dump(), "m");
    REQUIRE(std::holds_alternative<std::string>(answer));
    return json::parse(std::get<std::string>(answer));
  };
  const auto a = body({{"model", "m"}, {"prompt", "hello  big\tworld"}});
  CHECK(a["count"] == 3);
  CHECK(a["max_model_len"] == max_model_len);
  CHECK(a["tokens"] == json::array({sim::word_token("hello"), sim::word_token("big"), sim::word_token("world")}));
  CHECK(body({{"prompt", json::array({5, 4294967295ULL})}})["tokens"] == json::array({5, 4294967295ULL}));
  const auto chat = body({{"messages", json::array({{{"role", "system"}, {"content", "be brief"}},
                                                    {{"role", "user"},
                                                     {"content", json::array({{{"type", "text"}, {"text", "hi"}}})}}})},
                          {"add_generation_prompt", true}});
  CHECK(chat["tokens"] == json::array({sim::word_token("be"), sim::word_token("brief"), sim::word_token("hi")}));

  // The same tokens make the generation request's chain.
  const std::string prompt = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16";
  const auto parsed = parse_generation_request(api_kind::completions, "application/json",
                                               json{{"prompt", prompt}}.dump(), "m", 16, 16, true);
  const auto& gen = std::get<generation_request>(parsed);
  const auto ids = body({{"prompt", prompt}})["tokens"].get<std::vector<token_id>>();
  CHECK(std::vector<token_id>(gen.prompt_chain.tokens().begin(), gen.prompt_chain.tokens().end()) == ids);
  CHECK(gen.prompt_chain.chain() == sim::chain_hashes(ids, 16));

  // Errors: vLLM's shapes.
  const auto refused = [](const std::string& raw, std::string_view type = "application/json") {
    const auto answer = tokenize_request(type, raw, "m");
    REQUIRE(std::holds_alternative<api_error>(answer));
    return std::get<api_error>(answer).status;
  };
  CHECK(refused(json{{"model", "other"}, {"prompt", "x"}}.dump()) == 404);
  CHECK(refused(json{{"model", "m"}}.dump()) == 400);
  CHECK(refused(json{{"prompt", json::array({-1})}}.dump()) == 400);
  CHECK(refused(json{{"prompt", json::array({4294967296ULL})}}.dump()) == 400);
  CHECK(refused("{", "application/json") == 400);
  CHECK(refused(json{{"prompt", "x"}}.dump(), "text/plain") == 400);
}

TEST_CASE("generation: ids out of 32 bits and a bad cache_salt get 400, and a salt seeds the chain",
          "[kv-events][tokenize]") {
  const auto parse = [](const json& j) {
    return parse_generation_request(api_kind::completions, "application/json", j.dump(), "m", 16, 16, true);
  };
  const auto status = [&](const json& j) {
    const auto parsed = parse(j);
    return std::holds_alternative<api_error>(parsed) ? std::get<api_error>(parsed).status : 200U;
  };
  CHECK(status({{"prompt", json::array({1, 2})}}) == 200);
  CHECK(status({{"prompt", json::array({json::array({1, -2})})}}) == 400);
  CHECK(status({{"prompt", json::array({1.5})}}) == 400);
  CHECK(status({{"prompt", "x"}, {"cache_salt", ""}}) == 400);
  CHECK(status({{"prompt", "x"}, {"cache_salt", 5}}) == 400);
  CHECK(status({{"prompt", "x"}, {"cache_salt", nullptr}}) == 200);
  std::string prompt;
  for (int i = 0; i < 16; ++i) prompt += "w ";
  const auto plain = std::get<generation_request>(parse({{"prompt", prompt}}));
  const auto salted = std::get<generation_request>(parse({{"prompt", prompt}, {"cache_salt", "S"}}));
  REQUIRE(plain.prompt_chain.chain().size() == 1);
  CHECK(plain.prompt_chain.chain() != salted.prompt_chain.chain());
  CHECK(salted.prompt_chain.cache_salt() == "S");
}

TEST_CASE("options: the KV-events flags, their defaults and refusals", "[kv-events][options]") {
  const auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "dplb-mock-engine");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out;
    std::ostringstream err;
    return parse_command_line(static_cast<int>(argv.size()), argv.data(), out, err).options;
  };
  const auto off = parse({"--simulate"});
  REQUIRE(off);
  CHECK(off->kv_events_port == 0);
  CHECK_FALSE(off->engine.kv.record_events);
  const auto on = parse({"--simulate", "--ranks", "2", "--dp", "2", "--kv-events-port", "5557", "--kv-replay-port",
                         "5600", "--kv-events-encoding", "array", "--kv-events-int-hashes", "--kv-buffer-steps", "7",
                         "--kv-events-topic", "kv"});
  REQUIRE(on);
  CHECK(on->kv_events_port == 5557);
  CHECK(on->kv_replay_port == 5600);
  CHECK(on->kv_events_encoding == kv_event_encoding::array);
  CHECK(on->kv_events_int_hashes);
  CHECK(on->kv_buffer_steps == 7);
  CHECK(on->kv_events_topic == "kv");
  CHECK(on->engine.kv.record_events);
  const auto defaults = parse({"--simulate", "--kv-events-port", "5557"});
  REQUIRE(defaults);
  CHECK(defaults->kv_events_encoding == kv_event_encoding::map);
  CHECK_FALSE(defaults->kv_events_int_hashes);
  CHECK(defaults->kv_buffer_steps == 10000);
  CHECK(defaults->kv_replay_port == 0);
  CHECK(defaults->kv_events_topic.empty());

  CHECK_FALSE(parse({"--kv-events-port", "5557"}));                       // needs --simulate
  CHECK_FALSE(parse({"--simulate", "--kv-events-port", "0"}));            // no ephemeral ports
  CHECK_FALSE(parse({"--simulate", "--kv-replay-port", "5600"}));         // needs --kv-events-port
  CHECK_FALSE(parse({"--simulate", "--kv-events-int-hashes"}));
  CHECK_FALSE(parse({"--simulate", "--ranks", "2", "--dp", "2", "--kv-events-port", "65533"}));  // 4 engines
  CHECK(parse({"--simulate", "--ranks", "2", "--dp", "2", "--kv-events-port", "65532"}));
  CHECK_FALSE(parse({"--simulate", "--dp", "4", "--kv-events-port", "5557", "--kv-replay-port", "5560"}));  // overlap
  CHECK_FALSE(parse({"--simulate", "--kv-events-port", "5557", "--kv-events-encoding", "json"}));
}

TEST_CASE("admin: the KV-events routes", "[kv-events][admin]") {
  const auto command = [](std::string_view method, std::string_view target, std::string_view body = {}) {
    auto parsed = parse_admin_request(method, target, body, 2, 3);
    REQUIRE(std::holds_alternative<admin_command>(parsed));
    return std::get<admin_command>(parsed);
  };
  const auto status = [](std::string_view method, std::string_view target) {
    auto parsed = parse_admin_request(method, target, "", 2, 3);
    return std::holds_alternative<admin_answer>(parsed) ? std::get<admin_answer>(parsed).status : 200U;
  };
  const auto publish = command("POST", "/kv-events/publish?rank=1&engine=2", "raw\x01");
  CHECK(publish.action == admin_action::publish_kv_event);
  CHECK(publish.rank == 1);
  CHECK(publish.engine == 2);
  CHECK(publish.payload == "raw\x01");
  CHECK_FALSE(publish.seq);
  CHECK(command("POST", "/kv-events/publish?rank=0&engine=0&seq=-7").seq == -7);
  CHECK(status("POST", "/kv-events/publish?rank=0&engine=0&seq=x") == 400);
  CHECK(status("POST", "/kv-events/publish?rank=0") == 400);  // engine= required
  CHECK(status("GET", "/kv-events/publish?rank=0&engine=0") == 405);
  const auto all = command("POST", "/kv-events/reset?rank=1");
  CHECK(all.action == admin_action::reset_kv_cache);
  CHECK(all.all_engines);
  const auto one = command("POST", "/kv-events/reset?rank=1&engine=1");
  CHECK_FALSE(one.all_engines);
  CHECK(one.engine == 1);
  CHECK(status("POST", "/kv-events/reset?rank=1&engine=3") == 400);
  CHECK(status("POST", "/kv-events/reset") == 400);
}
