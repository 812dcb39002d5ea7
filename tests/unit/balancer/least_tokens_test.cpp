// least-tokens, one test per rule of its cost model (least_tokens.hpp): the band of request counts, the
// work (prompt tokens not yet prefilled, plus a share of max_tokens, plus a slot per request), a slot's
// tolerance, the ties, the prompt part leaving at the first byte, and the weights; and that a burst of like
// requests still lands exactly even.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/least_tokens.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "picks_per_rank.hpp"

using dplb::balancer::balancer;
using dplb::balancer::rank_view;
using dplb::balancer::least_tokens;
using dplb::balancer::make_policy;
using dplb::balancer::rank_lease;
using dplb::balancer::request_cost;
using dplb::balancer::test::picks_per_rank;

namespace {

// A rank with `inflight` requests owing `prompt` tokens of prefill (none yet at its first byte) and `decode`
// tokens of max_tokens.
rank_view rank_with(std::uint32_t inflight, std::uint64_t prompt, double weight = 1, std::uint64_t decode = 0) {
  rank_view h;
  h.inflight = inflight;
  h.cost_inflight = prompt + decode;
  h.prompt_inflight = prompt;
  h.weight = weight;
  return h;
}

constexpr request_cost short_request{.prompt = 200, .decode = 128};
constexpr request_cost long_prompt{.prompt = 8'000, .decode = 128};

}  // namespace

TEST_CASE("least-tokens: a request weighs its pending prompt, a share of its max_tokens, and one slot",
          "[balancer][least-tokens]") {
  CHECK(least_tokens::work_of(rank_with(0, 0)) == 0);
  CHECK(least_tokens::work_of(rank_with(2, 20)) == 20 + 2 * least_tokens::slot_tokens);
  CHECK(least_tokens::work_of(rank_with(2, 20, 2)) == (20 + 2 * least_tokens::slot_tokens) / 2);
  CHECK(least_tokens::work_of(rank_with(2, 20, 1, 400)) ==
        20 + least_tokens::decode_share * 400 + 2 * least_tokens::slot_tokens);
}

TEST_CASE("least-tokens: a prompt token not yet prefilled outweighs a token of max_tokens",
          "[balancer][least-tokens]") {
  least_tokens policy;
  // One request each, 2,000 tokens each: on rank 0 a prompt still to prefill, on rank 1 a generation to come
  // (its prompt done). Counted alike they would tie (and the rotation would start at rank 0); the pending
  // prefill weighs fully and max_tokens a quarter, 3,024 against 1,524, more than a slot apart.
  std::array ranks{rank_with(1, 2'000), rank_with(1, 0, 1, 2'000)};
  CHECK(policy.choose({}, ranks) == 1u);
}

TEST_CASE("least-tokens: the rank with the least work wins, though it runs more requests",
          "[balancer][least-tokens]") {
  least_tokens policy;
  // Two small requests (2 × 10 tokens) against one of 3,000: 2,068 against 4,024, more than a slot apart.
  std::array ranks{rank_with(2, 20), rank_with(1, 3'000)};
  CHECK(policy.choose({}, ranks) == 0u);
}

TEST_CASE("least-tokens: work within a slot of the least is a tie, which the fewest requests win",
          "[balancer][least-tokens]") {
  least_tokens policy;
  // 2,068 against 2,524: within a slot (1,024), so the count decides, as least-inflight would.
  std::array ranks{rank_with(2, 20), rank_with(1, 1'500)};
  CHECK(policy.choose({}, ranks) == 1u);
  // Equal counts and work within a slot: the rotation takes turns.
  std::array even{rank_with(3, 3'000), rank_with(3, 3'500)};
  const auto first = policy.choose({}, even);
  const auto second = policy.choose({}, even);
  REQUIRE(first);
  REQUIRE(second);
  CHECK(*first != *second);
}

TEST_CASE("least-tokens: only ranks within the band of the fewest requests are candidates",
          "[balancer][least-tokens]") {
  least_tokens policy;
  const auto band = static_cast<std::uint32_t>(least_tokens::request_band);
  // Rank 0 is prefilling a long prompt: it has the fewest requests, and by far the most work.
  std::array within{rank_with(1, 8'128), rank_with(1 + band, (1 + band) * 328)};
  CHECK(policy.choose({}, within) == 1u);
  // One request more and rank 1 leaves the band: the long prompt's rank takes the request after all.
  std::array beyond{rank_with(1, 8'128), rank_with(2 + band, (2 + band) * 328)};
  CHECK(policy.choose({}, beyond) == 0u);
}

TEST_CASE("least-tokens: a long prompt keeps its rank at most a band behind, and its prompt part leaves at the "
          "first byte",
          "[balancer][least-tokens]") {
  balancer b(2, make_policy("least-tokens"));
  auto big = b.acquire({}, long_prompt);
  const std::size_t other = 1 - big.rank();
  CHECK(b.cost_inflight(big.rank()) == 8'128);
  std::vector<rank_lease> held;
  for (int i = 0; i < 100; ++i) held.push_back(b.acquire({}, short_request));
  // Short requests go to the other rank first, but never more than the band (plus the one that leaves
  // it) beyond the long prompt's rank: 52 against 49.
  CHECK(b.inflight(other) == b.inflight(big.rank()) + least_tokens::request_band + 1);
  // The prefill is done: the prompt part leaves (once), and the rank, now the lighter, takes the next ones.
  big.prompt_done();
  big.prompt_done();
  CHECK(b.cost_inflight(big.rank()) == 128 + 48 * 328);
  held.push_back(b.acquire({}, short_request));
  CHECK(held.back().rank() == big.rank());
  big.release();
  held.clear();
  CHECK(b.cost_inflight(0) == 0);
  CHECK(b.cost_inflight(1) == 0);
}

TEST_CASE("least-tokens: long prompts not yet prefilled spread over the ranks", "[balancer][least-tokens]") {
  balancer b(4, make_policy("least-tokens"));
  std::vector<std::vector<rank_lease>> shorts(4);
  for (int i = 0; i < 8; ++i) {
    auto lease = b.acquire({}, short_request);  // 2 on every rank
    shorts[lease.rank()].push_back(std::move(lease));
  }
  // Each long prompt's rank then finishes its short requests, so that by the counts alone (least-inflight)
  // it would take the next long prompt too; by the work, the next one goes to a rank without one.
  std::vector<rank_lease> longs;
  std::vector<std::size_t> long_ranks;
  for (int i = 0; i < 4; ++i) {
    longs.push_back(b.acquire({}, long_prompt));
    long_ranks.push_back(longs.back().rank());
    shorts[longs.back().rank()].clear();
  }
  std::sort(long_ranks.begin(), long_ranks.end());
  CHECK(long_ranks == std::vector<std::size_t>{0, 1, 2, 3});
}

TEST_CASE("least-tokens: like requests land exactly even, though their token estimates differ",
          "[balancer][least-tokens][burst]") {
  balancer b(4, make_policy("least-tokens"));
  std::vector<rank_lease> held;
  for (std::uint32_t i = 0; i < 256; ++i) {
    // 1,024 tokens, give or take 5%, as a text prompt's estimate of a uniform benchmark varies.
    held.push_back(b.acquire({}, request_cost{.prompt = 973 + (i * 37) % 103, .decode = 128}));
  }
  CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{64, 64, 64, 64});
}

TEST_CASE("least-tokens honours weights: work and counts are per unit of weight", "[balancer][least-tokens]") {
  balancer b(3, make_policy("least-tokens"));
  b.set_weight(0, 2);
  std::vector<rank_lease> held;
  for (std::uint32_t i = 0; i < 400; ++i) {
    held.push_back(b.acquire({}, request_cost{.prompt = 973 + (i * 37) % 103, .decode = 128}));
  }
  CHECK(picks_per_rank(b) == std::vector<std::uint64_t>{200, 100, 100});
  // A long prompt on the heavy rank weighs half as much there: per weight, it still has the least work.
  least_tokens policy;
  // The same long prompt on each, and twice the requests on the rank of weight 2: (4 * 1,100 + 3,000 + 4
  // slots) / 2 = 5,748 against 2 * 1,100 + 3,000 + 2 slots = 7,248.
  std::array ranks{rank_with(4, 4 * 1'100 + 3'000, 2), rank_with(2, 2 * 1'100 + 3'000)};
  CHECK(policy.choose({}, ranks) == 0u);
}

namespace {

// Chooses rank 0 and keeps what it was shown.
struct view_spy final : dplb::balancer::policy {
  std::optional<std::size_t> choose(const dplb::balancer::pick_context&, std::span<const rank_view> ranks) override {
    seen.assign(ranks.begin(), ranks.end());
    return 0;
  }
  std::string_view name() const noexcept override { return "spy"; }
  std::vector<rank_view> seen;
};

}  // namespace

TEST_CASE("a policy sees the prompt part of the tokens in flight apart, until the first byte", "[balancer][least-tokens]") {
  auto spy = std::make_unique<view_spy>();
  auto* seen = spy.get();
  balancer b(1, std::move(spy));
  auto first = b.acquire({}, long_prompt);
  auto second = b.acquire({}, short_request);
  CHECK(seen->seen.at(0).cost_inflight == long_prompt.prompt + long_prompt.decode);
  CHECK(seen->seen.at(0).prompt_inflight == long_prompt.prompt);
  first.prompt_done();
  auto third = b.acquire({}, short_request);
  CHECK(seen->seen.at(0).prompt_inflight == short_request.prompt);
  CHECK(seen->seen.at(0).cost_inflight == long_prompt.decode + short_request.prompt + short_request.decode);
  second.release();  // before its first byte: its prompt leaves with it
  third.release();
  first.release();
  auto last = b.acquire();
  CHECK(seen->seen.at(0).prompt_inflight == 0);
  CHECK(seen->seen.at(0).cost_inflight == 0);
}
