// A request's chain (request_chain) against the chains the index builds from events: the base model's
// blocks match a plain request; a cache_salt or a LoRA adapter keep theirs apart, exactly as vLLM's extra
// keys (the adapter's name on every block, the salt on the first) do; and the index learns adapter names.
#include <catch2/catch.hpp>

#include <numeric>
#include <string>
#include <vector>

#include "dplb/kv/block_index.hpp"
#include "dplb/kv/chain_hash.hpp"
#include "dplb/kv/event_index.hpp"

using namespace dplb::kv;

namespace {

constexpr std::uint32_t block = 4;

std::vector<token_id> tokens(std::size_t blocks) {
  std::vector<token_id> t(blocks * block);
  std::iota(t.begin(), t.end(), 100);
  return t;
}

// A BlockStored as vLLM sends it for a request with this adapter and salt (extra_keys: [lora?, salt?] on the
// first block, [lora?] on the others, nil when empty).
block_stored stored(const std::vector<token_id>& toks, const std::string& lora, const std::string& salt) {
  block_stored s;
  const std::size_t blocks = toks.size() / block;
  for (std::size_t i = 0; i < blocks; ++i) s.block_hashes.push_back(engine_key_of_int(1000 + i));
  s.token_ids = toks;
  s.block_size = block;
  if (!lora.empty()) s.lora_name = lora;
  if (!lora.empty() || !salt.empty()) {
    std::vector<std::uint64_t> extra;
    for (std::size_t i = 0; i < blocks; ++i) {
      std::vector<std::string_view> keys;
      if (!lora.empty()) keys.push_back(lora);
      if (i == 0 && !salt.empty()) keys.push_back(salt);
      extra.push_back(keys.empty() ? 0 : extra_keys_digest(keys));
    }
    s.extra_keys = extra;
  }
  return s;
}

std::uint32_t matched(const block_index& index, const std::vector<token_id>& toks, const std::string& lora,
                      const std::string& salt) {
  std::vector<chain_hash> chain;
  request_chain(toks, block, lora, salt, 1 << 20, chain);
  std::vector<std::uint32_t> m;
  index.match(chain, 1, m);
  return m[0];
}

}  // namespace

TEST_CASE("request chain: matches the events' blocks of the same adapter and salt, and only those", "[kv]") {
  const auto toks = tokens(3);
  for (const auto& [lora, salt] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"", "tenant-a"}, {"adapter-1", ""}, {"adapter-1", "tenant-a"}}) {
    INFO("stored with lora '" << lora << "' salt '" << salt << "'");
    block_index index(100);
    apply_counts counts;
    index.apply(0, kv_event{stored(toks, lora, salt)}, counts);
    CHECK(matched(index, toks, lora, salt) == 3);
    CHECK(matched(index, toks, lora == "" ? "adapter-1" : "", salt) == 0);
    CHECK(matched(index, toks, lora, salt == "" ? "tenant-b" : "") == 0);
  }
}

TEST_CASE("event index: learns which model names are adapters from BlockStored's lora_name", "[kv]") {
  event_index index(100, 4);
  CHECK_FALSE(index.is_adapter("adapter-1"));
  decode_result d;
  d.batch.events.emplace_back(stored(tokens(1), "adapter-1", ""));
  index.apply(1, d, 0);
  CHECK(index.is_adapter("adapter-1"));
  CHECK_FALSE(index.is_adapter("base-model"));
  CHECK_FALSE(index.is_adapter(""));
  CHECK(index.feed(1)->events.load() == 1);
  CHECK(index.feed(1)->blocks.load() == 1);
}

TEST_CASE("event index: counts events, skipped events and unreadable messages per rank", "[kv]") {
  event_index index(100, 4);
  decode_result d;
  d.batch.events.emplace_back(stored(tokens(2), "", ""));
  d.batch.events.emplace_back(all_blocks_cleared{});
  d.unknown_type_events = 1;
  d.malformed_events = 2;
  d.batch.ts = 100.0;
  index.apply(2, d, 100.5);
  CHECK(index.feed(2)->events.load() == 2);
  CHECK(index.feed(2)->errors.load() == 3);
  CHECK(index.feed(2)->blocks.load() == 0);  // cleared after the store
  CHECK(index.feed(2)->last_batch_arrival.load() - index.feed(2)->last_batch_ts.load() == Approx(0.5));
  decode_result bad;
  bad.error = "not an EventBatch";
  index.apply(2, bad, 101);
  CHECK(index.feed(2)->errors.load() == 4);
  index.apply(7, d, 0);  // beyond the capacity: nothing, and no crash
  CHECK(index.feed(7) == nullptr);
}
