// A queued request is a whole request, through the real dplb and the mock engine: under
// --max-inflight-per-rank, with a burst far larger than the slots, requests that wait in dplb's queue
// still go where their prefix (prefix-aware) or their session (--affinity-header) is. Without the prefix
// chain and session key kept by the waiter, and without waiting for its own rank while others free
// first, a queued request goes wherever a slot frees: one time in four over four ranks.

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
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

bhttp::request<bhttp::string_body> completion(const std::string& prompt, const std::string& session = "") {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::host, "x");
  r.set(bhttp::field::content_type, "application/json");
  if (!session.empty()) r.set("x-session-id", session);
  r.body() = json{{"model", "mock-model"}, {"prompt", prompt}, {"max_tokens", 1}}.dump();
  r.prepare_payload();
  return r;
}

std::size_t rank_of(http_connection& client, const bhttp::request<bhttp::string_body>& request) {
  const auto r = client.send(request);
  REQUIRE(r.status == 200);
  return std::stoul(std::string(r.headers["x-dplb-rank"]));
}

// Sends every request at once, each on its own connection, and returns the share that the rank in
// `expected` (same index) served.
double share_on_expected_rank(std::uint16_t port, const std::vector<bhttp::request<bhttp::string_body>>& burst,
                              const std::vector<std::size_t>& expected) {
  std::vector<std::unique_ptr<http_connection>> connections;
  for (const auto& request : burst) {
    connections.push_back(std::make_unique<http_connection>(port));
    std::ostringstream wire;
    wire << request;
    connections.back()->write_raw(wire.str());
  }
  std::size_t on_rank = 0;
  std::map<std::size_t, int> served_by;
  for (std::size_t i = 0; i < connections.size(); ++i) {
    const auto responses = connections[i]->read_responses(1, 30s).final_responses();
    REQUIRE(responses.size() == 1);
    REQUIRE(responses[0].status == 200);
    const auto rank = std::stoul(responses[0].header("x-dplb-rank").value_or("999"));
    ++served_by[rank];
    if (rank == expected[i]) ++on_rank;
  }
  for (const auto& [rank, n] : served_by) UNSCOPED_INFO("rank " << rank << " served " << n);
  // The burst did queue: 80 requests over 8 slots.
  const auto m = scrape_metrics(port);
  CHECK(metric_sum(m, "dplb_queue_wait_seconds_count") >= 40);
  return static_cast<double>(on_rank) / static_cast<double>(burst.size());
}

// Four ranks of two slots each; every request takes 40 ms.
const std::vector<std::string> engine_args{"--ttft-ms", "40", "--itl-ms", "0"};

}  // namespace

TEST_CASE("prefix-aware under --max-inflight-per-rank: queued requests still go where their prefix is",
          "[queue][prefix]") {
  mock_engine engine(4, engine_args);
  dplb_proxy proxy(engine.urls(), {"--policy", "prefix-aware", "--max-inflight-per-rank", "2"});
  // Eight groups, two per rank: each group's first request places it.
  http_connection client(proxy.port());
  std::vector<std::size_t> group_rank;
  for (int group = 0; group < 8; ++group) {
    group_rank.push_back(rank_of(client, completion(group_prefix(group) + "first question")));
  }
  std::map<std::size_t, int> groups_per_rank;
  for (const auto r : group_rank) ++groups_per_rank[r];
  REQUIRE(groups_per_rank.size() == 4);
  // 80 requests at once, the groups interleaved: ten waves of the eight slots.
  std::vector<bhttp::request<bhttp::string_body>> burst;
  std::vector<std::size_t> expected;
  for (int i = 0; i < 80; ++i) {
    burst.push_back(completion(group_prefix(i % 8) + "burst question " + std::to_string(i)));
    expected.push_back(group_rank[static_cast<std::size_t>(i % 8)]);
  }
  const double share = share_on_expected_rank(proxy.port(), burst, expected);
  WARN("prefix-aware: " << share * 100 << "% of 80 queued requests on their group's rank");
  CHECK(share >= 0.8);
}

TEST_CASE("affinity under --max-inflight-per-rank: queued requests still go to their session's rank",
          "[queue][affinity]") {
  mock_engine engine(4, engine_args);
  dplb_proxy proxy(engine.urls(), {"--policy", "least-inflight", "--affinity-header", "x-session-id",
                                   "--max-inflight-per-rank", "2"});
  // Four sessions per rank, as the ring places them (one at a time, so each lands on its own rank).
  http_connection client(proxy.port());
  std::map<std::size_t, std::vector<std::string>> sessions_on;
  for (int i = 0; i < 256; ++i) {
    const auto id = "session-" + std::to_string(i);
    auto& on = sessions_on[rank_of(client, completion("hello from " + id, id))];
    if (on.size() < 4) on.push_back(id);
    bool enough = sessions_on.size() == 4;
    for (const auto& [rank, ids] : sessions_on) enough = enough && ids.size() == 4;
    if (enough) break;
  }
  REQUIRE(sessions_on.size() == 4);
  std::vector<std::pair<std::string, std::size_t>> sessions;  // interleaved over the ranks
  for (std::size_t k = 0; k < 4; ++k) {
    for (const auto& [rank, ids] : sessions_on) {
      REQUIRE(ids.size() == 4);
      sessions.emplace_back(ids[k], rank);
    }
  }
  std::vector<bhttp::request<bhttp::string_body>> burst;
  std::vector<std::size_t> expected;
  for (int i = 0; i < 80; ++i) {
    const auto& [id, rank] = sessions[static_cast<std::size_t>(i % 16)];
    burst.push_back(completion("turn " + std::to_string(i) + " of " + id, id));
    expected.push_back(rank);
  }
  const double share = share_on_expected_rank(proxy.port(), burst, expected);
  WARN("affinity: " << share * 100 << "% of 80 queued requests on their session's rank");
  CHECK(share >= 0.8);
}

TEST_CASE("a request held for its session's full rank takes an idle rank before its own queue wait runs out",
          "[queue][affinity]") {
  // Two ranks of one slot each; the queue's placement wait is long (half of --queue-timeout-ms: 15 s), the
  // request's own limit short (--max-queue-wait-ms). Held for its session's rank until its limit, it would
  // get 429 while the other rank sits idle; it takes that rank well before.
  mock_engine engine(2, {"--ttft-ms", "0", "--itl-ms", "10"});
  dplb_proxy proxy(engine.urls(), {"--policy", "least-inflight", "--affinity-header", "x-session-id",
                                   "--max-inflight-per-rank", "1", "--queue-timeout-ms", "30000",
                                   "--max-queue-wait-ms", "800"});
  http_connection client(proxy.port());
  const std::string session = "held-session";
  const auto home = rank_of(client, completion("where does this session live", session));
  // The session's rank is taken by a stream of ~3 s (300 tokens, 10 ms apart).
  auto blocker_request = completion("a long answer", session);
  blocker_request.body() =
      json{{"model", "mock-model"}, {"prompt", "a long answer"}, {"max_tokens", 300}, {"stream", true}}.dump();
  blocker_request.prepare_payload();
  http_connection blocker(proxy.port());
  std::ostringstream wire;
  wire << blocker_request;
  blocker.write_raw(wire.str());
  const auto home_label = "rank=\"" + std::to_string(home) + "\"";
  const auto busy = await_metrics(proxy.port(), [&](const auto& m) {
    return metric_sum(m, "dplb_rank_inflight{", {home_label}) == 1.0;
  });
  REQUIRE(metric_sum(busy, "dplb_rank_inflight{", {home_label}) == 1.0);

  const auto started = std::chrono::steady_clock::now();
  const auto held = client.send(completion("and the next turn", session));
  const auto took = std::chrono::steady_clock::now() - started;
  CHECK(held.status == 200);
  CHECK(std::string(held.headers["x-dplb-rank"]) != std::to_string(home));
  CHECK(took < 800ms * timing_slack());
  const auto done = blocker.read_responses(1, 30s).final_responses();
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == 200);
}
