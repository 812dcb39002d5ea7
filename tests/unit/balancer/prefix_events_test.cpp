// prefix-aware with the engines' KV-cache events: a request whose token ids are known is matched against
// what the events say each rank holds (whoever put it there), not against what dplb routed; below the
// threshold, or with no events configured, it falls back as before; the load bound still holds.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/kv/chain_hash.hpp"
#include "dplb/kv/event_index.hpp"

using namespace dplb::balancer;
namespace kv = dplb::kv;

namespace {

constexpr std::uint32_t block = 16;

std::vector<kv::token_id> tokens(std::size_t blocks, kv::token_id first) {
  std::vector<kv::token_id> t(blocks * block);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Stores `toks` on `rank` through a decoded BlockStored, as the subscriber would.
void store(kv::event_index& index, std::size_t rank, const std::vector<kv::token_id>& toks, std::uint64_t first_key) {
  kv::decode_result d;
  kv::block_stored s;
  for (std::size_t i = 0; i < toks.size() / block; ++i) s.block_hashes.push_back(kv::engine_key_of_int(first_key + i));
  s.token_ids = toks;
  s.block_size = block;
  d.batch.events.emplace_back(std::move(s));
  index.apply(rank, d, 0);
}

std::vector<std::uint64_t> request_chain(const std::vector<kv::token_id>& toks) {
  std::vector<std::uint64_t> out;
  kv::request_chain(toks, block, {}, {}, 1 << 20, out);
  return out;
}

prefix_aware_options with_events(const kv::event_index& index) {
  return {.load_bound = 1.25, .min_match_blocks = 1, .index_blocks_per_rank = 1024, .events = &index,
          .block_size = block, .event_min_match_blocks = 4};
}

}  // namespace

TEST_CASE("prefix-aware with events: the rank the events say holds the prefix takes it", "[prefix][kv]") {
  kv::event_index index(1024, 8);
  index.set_configured(0, true);
  const auto prefix = tokens(6, 1000);
  store(index, 2, prefix, 10);
  prefix_aware policy(with_events(index), nullptr);
  std::vector<rank_view> ranks(4);
  auto toks = prefix;
  const auto tail = tokens(1, 9000);
  toks.insert(toks.end(), tail.begin(), tail.end());
  const auto chain = request_chain(toks);
  pick_context request;
  request.kv_chain = chain;
  for (int i = 0; i < 3; ++i) CHECK(policy.choose(request, ranks) == 2u);  // one after the other
  CHECK(policy.preferred(request, ranks)->rank == 2u);
  // Within the load bound only: with 8 in flight on the others and 3 on it, rank 2 may take a fourth
  // (ceil(1.25 x 12 / 4) = 4); with 5 on it, not a sixth (ceil(1.25 x 14 / 4) = 5).
  for (auto& r : ranks) r.inflight = 3;
  ranks[3].inflight = 2;
  CHECK(policy.choose(request, ranks) == 2u);
  ranks[2].inflight = 5;
  CHECK(policy.choose(request, ranks) == 3u);  // over the bound: least in flight
}

TEST_CASE("prefix-aware with events: a match below --prefix-min-match, or no chain, is placed by load", "[prefix][kv]") {
  kv::event_index index(1024, 8);
  index.set_configured(0, true);
  store(index, 3, tokens(3, 1000), 10);  // 3 blocks: below the 4 a match needs
  prefix_aware policy(with_events(index), nullptr);
  std::vector<rank_view> ranks(4);
  const auto chain = request_chain(tokens(3, 1000));
  pick_context request;
  request.kv_chain = chain;
  std::vector<std::size_t> order;
  for (int i = 0; i < 4; ++i) order.push_back(*policy.choose(request, ranks));
  // Strict rotation from rank 0, except that the first tie goes to the longer match (rank 3).
  CHECK(order.front() == 3);
  CHECK(policy.preferred(request, ranks) == std::nullopt);
}

TEST_CASE("prefix-aware with events: the events decide over what dplb itself routed", "[prefix][kv]") {
  kv::event_index index(1024, 8);
  index.set_configured(1, true);
  const auto prefix = tokens(8, 5000);
  prefix_aware policy(with_events(index), nullptr);
  std::vector<rank_view> ranks(4);
  const auto chain = request_chain(prefix);
  const std::vector<std::uint64_t> approximate{11, 12, 13, 14, 15, 16, 17, 18};
  pick_context request;
  request.kv_chain = chain;
  request.prefix_chain = approximate;
  const auto first = *policy.choose(request, ranks);  // nothing cached anywhere: by load; remembered approximately
  // The engine that took it evicted it, and another rank got it from a client that bypassed dplb.
  const std::size_t holder = (first + 1) % 4;
  store(index, holder, prefix, 50);
  CHECK(policy.choose(request, ranks) == holder);
  // Without events configured anywhere, the approximate index speaks again.
  index.set_configured(1, false);
  CHECK(policy.choose(request, ranks) == first);
}

TEST_CASE("prefix-aware with events: a hot prefix keeps its rank within the load bound", "[prefix][kv]") {
  kv::event_index index(1024, 8);
  index.set_configured(0, true);
  const auto prefix = tokens(8, 7000);
  store(index, 0, prefix, 70);
  prefix_aware policy(with_events(index), nullptr);
  std::vector<rank_view> ranks(4);
  const auto chain = request_chain(prefix);
  pick_context request;
  request.kv_chain = chain;
  for (int i = 0; i < 40; ++i) ++ranks[*policy.choose(request, ranks)].inflight;
  CHECK(ranks[0].inflight == 13);  // ceil(1.25 x 40 / 4)
  for (const auto& r : ranks) CHECK(r.inflight <= 13);
}

TEST_CASE("prefix-aware with events: a prompt placed by load is followed until the events can show it", "[prefix][kv]") {
  kv::event_index index(1024, 8);
  index.set_configured(0, true);
  index.apply(0, kv::decode_result{}, 0);  // rank 0's publisher has been heard from (an empty batch)
  prefix_aware policy(with_events(index), nullptr);
  std::vector<rank_view> ranks(4);
  const auto group = tokens(6, 3000);
  const auto chain = request_chain(group);
  pick_context request;
  request.kv_chain = chain;
  // Nothing cached: the first goes by load; the next ones of the group follow it while its prefill is
  // pending (the events say nothing yet), though each pick alone would rotate.
  const auto first = *policy.choose(request, ranks);
  for (int i = 0; i < 3; ++i) CHECK(policy.choose(request, ranks) == first);
  // Once the events show the group elsewhere (another replica's request, a client), they decide.
  const std::size_t other = (first + 2) % 4;
  store(index, other, group, 300);
  CHECK(policy.choose(request, ranks) == other);
  // A removal the events report for a pick made on their evidence takes effect at once: by load again.
  kv::decode_result removed;
  kv::block_removed r;
  for (std::uint64_t k = 300; k < 306; ++k) r.block_hashes.push_back(kv::engine_key_of_int(k));
  removed.batch.events.emplace_back(std::move(r));
  index.apply(other, removed, 0);
  CHECK(index.feed(other)->blocks.load() == 0);
  // (the pending route to `first` still stands: it was placed by load, and nothing showed it cached there)
  CHECK(policy.choose(request, ranks) == first);
}

TEST_CASE("pending routes: expire after their ttl, are bounded, and follow the latest route", "[prefix][kv]") {
  using clock = pending_routes::clock;
  pending_routes routes(std::chrono::milliseconds(100), 8);
  const std::vector<std::uint64_t> chain{1, 2, 3, 4};
  const auto t0 = clock::now();
  routes.remember(2, chain, t0);
  std::vector<std::uint32_t> m;
  routes.match(chain, 4, t0, m);
  CHECK(m == std::vector<std::uint32_t>{0, 0, 4, 0});
  routes.match(chain, 4, t0 + std::chrono::milliseconds(100), m);
  CHECK(m == std::vector<std::uint32_t>{0, 0, 0, 0});  // expired
  routes.remember(1, std::vector<std::uint64_t>{1, 2}, t0);
  routes.match(chain, 4, t0, m);
  CHECK(m == std::vector<std::uint32_t>{0, 2, 0, 0});  // blocks 1 and 2 now lead to rank 1; 3 and 4 to rank 2
  routes.remember(3, std::vector<std::uint64_t>{10, 11, 12, 13, 14, 15, 16, 17}, t0);
  CHECK(routes.size() <= 8);
  routes.match(chain, 4, t0, m);
  CHECK(m == std::vector<std::uint32_t>{0, 0, 0, 0});  // the oldest went first
  routes.forget(3);
  CHECK(routes.size() == 0);
}

TEST_CASE("prefix-aware with events: a rank whose publisher has sent nothing keeps the approximate index", "[prefix][kv]") {
  kv::event_index index(1024, 8);
  for (std::size_t r = 0; r < 4; ++r) index.set_configured(r, true);  // #kv-events= on every rank, none heard yet
  // Routes placed by load stand in for the events for pending_ttl (10 s in dplb): 0 here, so that what is
  // checked below is what dplb does once they have expired.
  auto options = with_events(index);
  options.pending_ttl = std::chrono::milliseconds(0);
  prefix_aware policy(options, nullptr);
  std::vector<rank_view> ranks(4);
  const auto group = tokens(6, 3000);
  const auto chain = request_chain(group);
  const std::vector<std::uint64_t> approximate{31, 32, 33, 34, 35, 36};
  pick_context request;
  request.kv_chain = chain;
  request.prefix_chain = approximate;
  // Each pick alone would rotate over the idle ranks: the approximate index keeps the group together.
  const auto first = *policy.choose(request, ranks);
  for (int i = 0; i < 3; ++i) CHECK(policy.choose(request, ranks) == first);
  // Once a rank is heard from, the events decide: another rank holds the group.
  const std::size_t other = (first + 1) % 4;
  store(index, other, group, 600);
  CHECK(policy.choose(request, ranks) == other);
  // A source removed and configured again is heard anew.
  index.set_configured(other, false);
  index.set_configured(other, true);
  CHECK(policy.choose(request, ranks) == first);
}
