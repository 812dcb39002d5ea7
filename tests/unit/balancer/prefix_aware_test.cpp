// prefix-aware and what it stands on: the prompt's block chain, the bounded per-rank index with LRU
// eviction, the load bound, and the policy's two rules (where the prefix is, within the bound; else
// least-inflight with ties to the longer match), with exactly least-inflight's placement for prompts that
// share nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/least_inflight.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/balancer/prefix_index.hpp"
#include "dplb/balancer/routing_stats.hpp"
#include "picks_per_rank.hpp"

using namespace dplb::balancer;

namespace {

std::string text(char fill, std::size_t bytes) { return std::string(bytes, fill); }

std::vector<prefix_hash> chain_of(const std::string& prompt, prefix_hash seed = 0) {
  prefix_chain_builder b(seed);
  b.feed(prompt);
  return b.take();
}

// A prompt: a shared head of `head` blocks of one letter, then a tail of `tail` blocks of another.
std::vector<prefix_hash> prompt(char head_letter, std::size_t head, char tail_letter, std::size_t tail) {
  return chain_of(text(head_letter, head * prefix_block_bytes) + text(tail_letter, tail * prefix_block_bytes));
}

std::vector<rank_view> idle(std::size_t n) { return std::vector<rank_view>(n); }

pick_context with_chain(const std::vector<prefix_hash>& chain) {
  pick_context c;
  c.prefix_chain = chain;
  return c;
}

}  // namespace

TEST_CASE("prefix chain: full blocks only, equal prefixes hash equal, the model seeds it", "[prefix]") {
  constexpr std::size_t block = prefix_block_bytes;
  CHECK(chain_of(text('a', block + block / 2)).size() == 1);  // one full block; the partial one is left out
  const auto a = chain_of(text('a', 2 * block) + "x");
  const auto b = chain_of(text('a', 2 * block) + text('y', block));
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 3);
  CHECK(a[0] == b[0]);
  CHECK(a[1] == b[1]);
  // Fed in pieces or at once: the same chain.
  prefix_chain_builder pieces;
  pieces.feed(text('a', block / 2 + 3));
  pieces.feed(text('a', block + block / 2 - 3));
  pieces.feed("x");
  CHECK(pieces.take() == a);
  // A change in the first block changes every hash after it.
  auto changed = text('a', 2 * block);
  changed[3] = 'b';
  const auto c = chain_of(changed);
  CHECK(c[0] != a[0]);
  CHECK(c[1] != a[1]);
  // Another model: nothing in common.
  auto seeded = a;
  prefix_chain_builder::reseed(seeded, prefix_chain_builder::seed_of("model-b"));
  CHECK(seeded[0] != a[0]);
  CHECK(prefix_chain_builder::seed_of("model-a") != prefix_chain_builder::seed_of("model-b"));
  // Message boundaries count: "ab" + "c" is not "a" + "bc".
  prefix_chain_builder one;
  one.feed(text('a', block / 2));
  one.separate();
  one.feed(text('a', block / 2 + 10));
  prefix_chain_builder two;
  two.feed(text('a', block / 2 + 1));
  two.separate();
  two.feed(text('a', block / 2 + 9));
  const auto one_chain = one.take();
  REQUIRE(one_chain.size() == 1);
  CHECK(one_chain != two.take());
  // A huge prompt stops at max_prefix_blocks.
  CHECK(chain_of(text('z', (max_prefix_blocks + 10) * block)).size() == max_prefix_blocks);
}

TEST_CASE("prefix index: the longest leading match per rank", "[prefix]") {
  prefix_index index(100);
  index.insert(0, prompt('a', 3, 'b', 2));
  index.insert(1, prompt('a', 3, 'c', 1));
  index.insert(2, prompt('d', 2, 'b', 2));
  std::vector<std::uint32_t> m;
  index.match(prompt('a', 3, 'b', 4), 4, m);
  CHECK(m == std::vector<std::uint32_t>{5, 3, 0, 0});
  index.match(prompt('a', 3, 'c', 1), 4, m);
  CHECK(m == std::vector<std::uint32_t>{3, 4, 0, 0});
  index.match(prompt('x', 1, 'b', 2), 4, m);
  CHECK(m == std::vector<std::uint32_t>{0, 0, 0, 0});
  index.match({}, 4, m);
  CHECK(m == std::vector<std::uint32_t>{0, 0, 0, 0});
  CHECK(index.blocks(0) == 5);
  CHECK(index.blocks(1) == 4);
  CHECK(index.blocks(3) == 0);
}

TEST_CASE("prefix index: a rank keeps at most its capacity, forgetting the least recently used", "[prefix]") {
  prefix_index index(6);
  const auto first = prompt('a', 4, 'a', 0);
  const auto second = prompt('b', 4, 'b', 0);
  index.insert(0, first);
  index.insert(0, second);  // 8 blocks for 6 places: two of the first prompt's go, its tail first
  CHECK(index.blocks(0) == 6);
  std::vector<std::uint32_t> m;
  index.match(second, 1, m);
  CHECK(m[0] == 4);
  index.match(first, 1, m);
  CHECK(m[0] == 2);  // its head survived: it was used more recently than its tail
  index.insert(0, first);  // used again (all 4 back): now the second prompt is the older, and half gone
  index.match(second, 1, m);
  CHECK(m[0] == 2);
  index.insert(0, prompt('c', 3, 'c', 0));  // 3 more: the second's 2 and the first's tail go
  index.match(first, 1, m);
  CHECK(m[0] == 3);
  index.match(second, 1, m);
  CHECK(m[0] == 0);
  // A chain longer than the capacity keeps its head.
  prefix_index small(2);
  small.insert(0, prompt('q', 5, 'q', 0));
  small.match(prompt('q', 5, 'q', 0), 1, m);
  CHECK(m[0] == 2);
  small.forget(0);
  CHECK(small.blocks(0) == 0);
  small.match(prompt('q', 5, 'q', 0), 1, m);
  CHECK(m[0] == 0);
}

TEST_CASE("load bound: at most C times the fair share, this request included, rounded up", "[prefix]") {
  auto ranks = idle(4);
  CHECK(load_bound(ranks, 1.25).allows(ranks[0]));  // idle: ceil(1.25 * 1 / 4) = 1 place each
  ranks[0].inflight = 1;
  CHECK_FALSE(load_bound(ranks, 1.25).allows(ranks[0]));  // 2 > ceil(1.25 * 2 / 4) = 1
  ranks = idle(4);
  for (auto& h : ranks) h.inflight = 8;
  ranks[0].inflight = 11;  // 35 in flight: 11 + 1 <= ceil(1.25 * 36 / 4) = 12
  CHECK(load_bound(ranks, 1.25).allows(ranks[0]));
  ranks[0].inflight = 12;  // 36 in flight: 12 + 1 > ceil(1.25 * 37 / 4) = 12
  CHECK_FALSE(load_bound(ranks, 1.25).allows(ranks[0]));
  ranks[1].usable = false;  // the unusable neither count nor are allowed
  CHECK_FALSE(load_bound(ranks, 1.25).allows(ranks[1]));
  // A share that is a whole number stays one, whatever the rounding of the product: 1.1 * 100 / 2 is 55,
  // which doubles compute as 55.00000000000001.
  std::vector<rank_view> two(2);
  two[0].inflight = 55;
  two[1].inflight = 44;
  CHECK_FALSE(load_bound(two, 1.1).allows(two[0]));  // 56 > 55
  two[0].inflight = 54;
  two[1].inflight = 45;
  CHECK(load_bound(two, 1.1).allows(two[0]));  // 55 <= 55
}

TEST_CASE("prefix-aware: a request goes where its prefix went, while that rank is within the bound", "[prefix]") {
  routing_stats stats(8);
  prefix_aware policy({.load_bound = 1.25, .min_match_blocks = 2, .index_blocks_per_rank = 1000}, &stats);
  auto ranks = idle(4);
  const auto group = prompt('g', 8, 'q', 1);
  const auto first = policy.choose(with_chain(group), ranks);
  REQUIRE(first);
  CHECK(stats.prefix_missed == 1);
  // Same 8-block head, another question: the same rank, though the others are as idle.
  for (int i = 0; i < 3; ++i) {
    const auto again = policy.choose(with_chain(prompt('g', 8, static_cast<char>('r' + i), 1)), ranks);
    CHECK(again == first);
  }
  CHECK(stats.prefix_taken == 3);
  CHECK(stats.index_blocks[*first] == 9 + 3);  // the head once, each question's block apart
  // Its rank loaded beyond the bound: the prefix is overridden and least-inflight decides.
  ranks[*first].inflight = 3;  // 3 + 1 > ceil(1.25 * 4 / 4) = 2
  const auto elsewhere = policy.choose(with_chain(group), ranks);
  REQUIRE(elsewhere);
  CHECK(*elsewhere != *first);
  CHECK(stats.prefix_overridden == 1);
  // A match below the threshold does not count against a lighter rank. Loads where the bound allows the
  // match's rank (4 a rank, 5 on it: 5 + 1 <= ceil(1.25 * 18 / 4) = 6).
  routing_stats strict_stats(8);
  prefix_aware strict({.load_bound = 1.25, .min_match_blocks = 10, .index_blocks_per_rank = 1000}, &strict_stats);
  prefix_aware lenient({.load_bound = 1.25, .min_match_blocks = 9, .index_blocks_per_rank = 1000}, nullptr);
  ranks = idle(4);
  const auto s0 = strict.choose(with_chain(group), ranks);
  const auto l0 = lenient.choose(with_chain(group), ranks);
  REQUIRE(s0);
  REQUIRE(l0);
  for (auto& h : ranks) h.inflight = 4;
  auto strict_ranks = ranks;
  strict_ranks[*s0].inflight = 5;
  ranks[*l0].inflight = 5;
  CHECK(lenient.choose(with_chain(group), ranks) == l0);          // 9 blocks matched, 9 needed: stays
  CHECK(strict.choose(with_chain(group), strict_ranks) != s0);    // 9 matched, 10 needed: least-inflight
  CHECK(strict_stats.prefix_missed == 2);
}

TEST_CASE("prefix-aware: least-inflight's ties go to the longer match", "[prefix]") {
  prefix_aware policy({.load_bound = 1.25, .min_match_blocks = 4, .index_blocks_per_rank = 1000}, nullptr);
  auto ranks = idle(3);
  ranks[0].usable = false;
  ranks[1].usable = false;
  REQUIRE(policy.choose(with_chain(prompt('s', 1, 't', 0)), ranks) == 2u);  // rank 2 now holds that block
  ranks[0].usable = true;
  ranks[1].usable = true;
  // All idle: a 1-block match, below the threshold of 4, still settles least-inflight's tie, every time
  // (not the rotation).
  for (int i = 0; i < 4; ++i) CHECK(policy.choose(with_chain(prompt('s', 1, 'u', 1)), ranks) == 2u);
  // But not against a less loaded rank.
  ranks[2].inflight = 1;
  CHECK(policy.choose(with_chain(prompt('s', 1, 'u', 1)), ranks) != 2u);
}

TEST_CASE("prefix-aware: prompts that share nothing are placed exactly as least-inflight places them", "[prefix]") {
  prefix_aware prefix({}, nullptr);
  least_inflight reference;
  auto a = idle(4);
  auto b = idle(4);
  for (std::size_t i = 0; i < 200; ++i) {
    const auto chain = chain_of(std::to_string(i) + text('p', 300));  // every prompt differs from its first block
    const auto x = prefix.choose(with_chain(chain), a);
    const auto y = reference.choose({}, b);
    REQUIRE(x);
    REQUIRE(x == y);
    ++a[*x].inflight;
    ++b[*y].inflight;
    // Requests end now and then, unevenly, so that loads differ and ties are not always all-way.
    if (i % 3 == 2 && a[i % 4].inflight > 0) {
      --a[i % 4].inflight;
      --b[i % 4].inflight;
    }
  }
}

TEST_CASE("prefix-aware through the balancer: a burst of 256 unrelated prompts lands 64/64/64/64", "[prefix]") {
  balancer b(4, std::make_unique<prefix_aware>(prefix_aware_options{}, nullptr));
  std::vector<rank_lease> leases;
  std::vector<std::vector<prefix_hash>> chains;
  chains.reserve(256);
  for (int i = 0; i < 256; ++i) {
    chains.push_back(chain_of("request " + std::to_string(i) + " " + text('w', 500)));
    pick_context c;
    c.prefix_chain = chains.back();
    leases.push_back(b.acquire(c));
    REQUIRE(leases.back());
  }
  CHECK(test::picks_per_rank(b) == std::vector<std::uint64_t>{64, 64, 64, 64});
}

TEST_CASE("prefix-aware: a hot group of 40 concurrent requests stays within the bound", "[prefix]") {
  balancer b(4, std::make_unique<prefix_aware>(prefix_aware_options{.load_bound = 1.25}, nullptr));
  const auto hot = prompt('h', 50, 'h', 0);
  std::vector<rank_lease> leases;
  for (int i = 0; i < 40; ++i) {
    pick_context c;
    c.prefix_chain = hot;
    leases.push_back(b.acquire(c));
    REQUIRE(leases.back());
    std::size_t most = 0;
    for (std::size_t r = 0; r < 4; ++r) most = std::max<std::size_t>(most, b.inflight(r));
    // inflight <= ceil(1.25 * total / 4) after every pick.
    CHECK(static_cast<double>(most) <= std::ceil(1.25 * static_cast<double>(i + 1) / 4));
  }
  // The overflow spread over the others; each of them then holds the prefix too, and shares the group.
  const auto counts = test::picks_per_rank(b);
  CHECK(*std::max_element(counts.begin(), counts.end()) <= 13);  // ceil(1.25 * 40 / 4)
  CHECK(std::count(counts.begin(), counts.end(), 0) == 0);
}
