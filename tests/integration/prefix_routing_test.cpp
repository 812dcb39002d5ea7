// Prefix-aware routing and session affinity through the real dplb: requests that share a long prefix go
// where it went before, one group per rank; a hot group cannot load its rank beyond --load-bound; a
// session sticks to one rank and sessions spread; requests with nothing to follow rotate strictly.

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "text.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

bhttp::request<bhttp::string_body> completion(const std::string& prompt, int max_tokens, bool stream,
                                              const std::string& session = "") {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::host, "x");
  r.set(bhttp::field::content_type, "application/json");
  if (!session.empty()) r.set("x-session-id", session);
  r.body() = json{{"model", "mock-model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", stream}}.dump();
  r.prepare_payload();
  return r;
}

std::string rank_of(http_connection& client, const bhttp::request<bhttp::string_body>& request) {
  const auto r = client.send(request);
  REQUIRE(r.status == 200);
  return std::string(r.headers["x-dplb-rank"]);
}

std::string rank_label(std::size_t rank) { return "rank=\"" + std::to_string(rank) + "\""; }

}  // namespace

TEST_CASE("prefix-aware: requests sharing a long prefix stick to one rank per group, and the groups spread",
          "[prefix]") {
  mock_engine engine(4);
  dplb_proxy proxy(engine.urls(), {"--policy", "prefix-aware"});
  http_connection client(proxy.port());
  std::map<int, std::set<std::string>> ranks_by_group;
  for (int round = 0; round < 6; ++round) {
    for (int group = 0; group < 4; ++group) {
      const auto prompt = group_prefix(group) + "question " + std::to_string(round) + " of group " + std::to_string(group);
      ranks_by_group[group].insert(rank_of(client, completion(prompt, 2, false)));
    }
  }
  std::set<std::string> group_ranks;
  for (const auto& [group, ranks] : ranks_by_group) {
    INFO("group " << group);
    CHECK(ranks.size() == 1);
    group_ranks.insert(*ranks.begin());
  }
  CHECK(group_ranks.size() == 4);  // one group per rank
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_prefix_decisions_total{", {"outcome=\"taken\""}) == 20);   // every repeat
  CHECK(metric_sum(m, "dplb_prefix_decisions_total{", {"outcome=\"missed\""}) == 4);   // each group's first
  CHECK(metric_sum(m, "dplb_prefix_matched_tokens_count") == 24);
  CHECK(metric_sum(m, "dplb_prefix_index_blocks{", {rank_label(0)}) >= 2000 / 256);  // a group's prefix, at least
}

TEST_CASE("prefix-aware: a hot group of 40 concurrent requests cannot push its rank above the bound", "[prefix]") {
  mock_engine engine(4, {"--ttft-ms", "60000"});  // every stream stays in flight until its client leaves
  dplb_proxy proxy(engine.urls(), {"--policy", "prefix-aware", "--load-bound", "1.25"});
  std::vector<std::unique_ptr<http_connection>> held;
  for (int i = 0; i < 40; ++i) {
    held.push_back(std::make_unique<http_connection>(proxy.port()));
    std::ostringstream wire;
    wire << completion(group_prefix(7) + "hot question " + std::to_string(i), 4, true);
    held.back()->write_raw(wire.str());
  }
  const auto m = await_metrics(proxy.port(), [](const auto& metrics) {
    return metric_sum(metrics, "dplb_rank_inflight{") == 40;
  });
  REQUIRE(metric_sum(m, "dplb_rank_inflight{") == 40);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(metric_sum(m, "dplb_rank_inflight{", {rank_label(r)}) <= std::ceil(1.25 * 40 / 4));
  }
  CHECK(metric_sum(m, "dplb_prefix_decisions_total{", {"outcome=\"taken\""}) > 0);
  CHECK(metric_sum(m, "dplb_prefix_decisions_total{", {"outcome=\"overridden\""}) > 0);
}

TEST_CASE("affinity: every session stays on one rank, sessions spread, headerless requests rotate", "[affinity]") {
  const auto policy = GENERATE(as<std::string>{}, "least-inflight", "prefix-aware");
  INFO(policy);
  mock_engine engine(4);
  dplb_proxy proxy(engine.urls(), {"--policy", policy, "--affinity-header", "x-session-id"});
  http_connection client(proxy.port());
  std::map<std::string, std::set<std::string>> ranks_by_session;
  for (int turn = 0; turn < 4; ++turn) {
    for (int session = 0; session < 16; ++session) {
      const auto id = "session-" + std::to_string(session);
      ranks_by_session[id].insert(rank_of(client, completion("turn " + std::to_string(turn) + " of " + id, 2, false, id)));
    }
  }
  std::map<std::string, int> sessions_per_rank;
  for (const auto& [id, ranks] : ranks_by_session) {
    INFO(id);
    CHECK(ranks.size() == 1);
    ++sessions_per_rank[*ranks.begin()];
  }
  CHECK(sessions_per_rank.size() == 4);  // the 16 sessions use every rank
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_affinity_decisions_total{", {"outcome=\"taken\""}) == 64);

  // Without the header: strictly in turn, as the policy places unrelated requests on idle ranks.
  std::vector<std::string> order;
  for (int i = 0; i < 8; ++i) order.push_back(rank_of(client, completion("unrelated request " + std::to_string(i), 2, false)));
  for (int i = 4; i < 8; ++i) CHECK(order[static_cast<std::size_t>(i)] == order[static_cast<std::size_t>(i - 4)]);
  CHECK(std::set<std::string>(order.begin(), order.begin() + 4).size() == 4);
}

TEST_CASE("affinity: a session's rank over the bound sends its request to the next rank on the ring", "[affinity]") {
  mock_engine engine(4, {"--ttft-ms", "60000"});
  dplb_proxy proxy(engine.urls(), {"--policy", "least-inflight", "--affinity-header", "x-session-id"});
  std::vector<std::unique_ptr<http_connection>> held;
  for (int i = 0; i < 12; ++i) {
    held.push_back(std::make_unique<http_connection>(proxy.port()));
    std::ostringstream wire;
    wire << completion("one busy session, request " + std::to_string(i), 4, true, "busy");
    held.back()->write_raw(wire.str());
  }
  const auto m = await_metrics(proxy.port(), [](const auto& metrics) {
    return metric_sum(metrics, "dplb_rank_inflight{") == 12;
  });
  REQUIRE(metric_sum(m, "dplb_rank_inflight{") == 12);
  for (std::size_t r = 0; r < 4; ++r) CHECK(metric_sum(m, "dplb_rank_inflight{", {rank_label(r)}) <= std::ceil(1.25 * 12 / 4));
  CHECK(metric_sum(m, "dplb_affinity_decisions_total{", {"outcome=\"overridden\""}) > 0);
}
