// Where requests go beyond plain counting: weights, slow start after a readmission, a pinned rank's own
// queue, token costs (least-tokens) and load that reached the engines through another dplb replica
// (least-load). Long streams are held open (written, never read) so that what is in flight is known.

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string rank_label(std::size_t rank) { return "rank=\"" + std::to_string(rank) + "\""; }

bhttp::request<bhttp::string_body> completion(const std::string& prompt, int max_tokens, bool stream,
                                              std::optional<std::size_t> pin = {}) {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::host, "x");
  r.set(bhttp::field::content_type, "application/json");
  if (pin) r.set("X-data-parallel-rank", std::to_string(*pin));
  r.body() = json{{"model", "mock-model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", stream}}.dump();
  r.prepare_payload();
  return r;
}

// A request written and left open: its stream stays in flight until the connection closes.
struct held_streams {
  std::vector<std::unique_ptr<http_connection>> connections;
  void open(std::uint16_t port, const bhttp::request<bhttp::string_body>& request) {
    connections.push_back(std::make_unique<http_connection>(port));
    std::ostringstream wire;
    wire << request;
    connections.back()->write_raw(wire.str());
  }
};

std::vector<double> inflight_by_rank(std::uint16_t port, std::size_t ranks) {
  const auto m = scrape_metrics(port);
  std::vector<double> out;
  for (std::size_t r = 0; r < ranks; ++r) out.push_back(metric_sum(m, "dplb_rank_inflight{", {rank_label(r)}));
  return out;
}

double total(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum;
}

// Waits until dplb has `count` requests in flight over its ranks, and returns them by rank.
std::vector<double> await_inflight(std::uint16_t port, std::size_t ranks, double count) {
  const auto by_rank = await_until([&] { return inflight_by_rank(port, ranks); },
                                   [&](const std::vector<double>& v) { return total(v) == count; }, 10s);
  REQUIRE(total(by_rank) == count);
  return by_rank;
}

std::map<std::string, int> ranks_of(std::uint16_t port, int requests) {
  http_connection client(port);
  std::map<std::string, int> seen;
  for (int i = 0; i < requests; ++i) {
    const auto r = client.send(completion("a b c", 1, false));
    REQUIRE(r.status == 200);
    ++seen[std::string(r.headers["x-dplb-rank"])];
  }
  return seen;
}

}  // namespace

TEST_CASE("#weight=W splits traffic in the ratio of the weights", "[placement][weights]") {
  const auto policy = GENERATE(as<std::string>{}, "round-robin", "least-inflight", "least-load", "least-tokens");
  INFO(policy);
  mock_engine engine(2);
  dplb_proxy proxy({engine.urls()[0] + "#weight=3", engine.urls()[1]}, {"--policy", policy});
  const auto seen = ranks_of(proxy.port(), 12);
  CHECK(seen.at("0") == 9);
  CHECK(seen.at("1") == 3);
}

TEST_CASE("a rank back from failed health checks ramps up over --slow-start", "[placement][slow-start]") {
  const auto slow_start = GENERATE(as<std::string>{}, "60s", "0");
  INFO("--slow-start " << slow_start);
  mock_engine engine(2, {"--itl-ms", "20"});
  dplb_proxy proxy(engine.urls(), {"--policy", "least-inflight", "--slow-start", slow_start,
                                   "--health-check-interval-ms", "50", "--unhealthy-threshold", "1",
                                   "--healthy-threshold", "1"});
  engine.set_fault(1, R"({"health_status": 503})");
  await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_healthy{", {rank_label(1)}) == 0; });
  held_streams streams;
  for (int i = 0; i < 10; ++i) streams.open(proxy.port(), completion("a b c", 1000, true));
  CHECK(await_inflight(proxy.port(), 2, 10) == std::vector<double>{10, 0});

  engine.clear_fault(1);
  await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_healthy{", {rank_label(1)}) == 1; });
  for (int i = 0; i < 10; ++i) streams.open(proxy.port(), completion("a b c", 1000, true));
  const auto by_rank = await_inflight(proxy.port(), 2, 20);
  if (slow_start == "0") {
    CHECK(by_rank[1] >= 9);  // at full weight at once: it takes nearly all of them
  } else {
    // At a tenth of its weight it counts as ten times as loaded: one or two of the ten.
    CHECK(by_rank[1] >= 1);
    CHECK(by_rank[1] <= 3);
  }
}

TEST_CASE("a pinned request to a full rank waits in that rank's queue while others flow", "[placement][pinned]") {
  mock_engine engine(2, {"--itl-ms", "20"});
  dplb_proxy proxy(engine.urls(), {"--policy", "least-inflight", "--max-inflight-per-rank", "1"});
  held_streams first;
  first.open(proxy.port(), completion("a b c", 1000, true, 1));
  CHECK(await_inflight(proxy.port(), 2, 1) == std::vector<double>{0, 1});

  // A second request pinned to rank 1 waits, though rank 0 has room.
  http_connection pinned(proxy.port());
  std::ostringstream wire;
  wire << completion("a b c", 2, false, 1);
  pinned.write_raw(wire.str());
  const auto queued = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_queue_depth") == 1; });
  REQUIRE(metric_sum(queued, "dplb_queue_depth") == 1);
  // An unpinned request is not held up behind it.
  const auto other = ranks_of(proxy.port(), 1);
  CHECK(other.count("0") == 1);

  // The first stream's client leaves: its slot goes to the pinned waiter, on rank 1.
  first.connections.clear();
  const auto reply = pinned.read_responses(1, 10s);
  REQUIRE(reply.final_responses().size() == 1);
  CHECK(reply.final_responses()[0].status == 200);
  CHECK(reply.final_responses()[0].header("x-dplb-rank") == "1");
}

TEST_CASE("least-tokens keeps short requests off a rank busy with a long prompt", "[placement][least-tokens]") {
  const auto policy = GENERATE(as<std::string>{}, "least-tokens", "least-inflight");
  INFO(policy);
  // The first token comes after 5 s: until then every request is in its prefill.
  mock_engine engine(2, {"--ttft-ms", "5000", "--itl-ms", "5"});
  dplb_proxy proxy(engine.urls(), {"--policy", policy});
  held_streams streams;
  std::string long_prompt;
  for (int i = 0; i < 10'000; ++i) long_prompt += "abc ";  // 40,000 bytes: about 10,000 tokens
  streams.open(proxy.port(), completion(long_prompt, 16, true));
  const auto after_long = await_inflight(proxy.port(), 2, 1);
  const std::size_t long_rank = after_long[0] == 1 ? 0 : 1;
  for (int i = 0; i < 4; ++i) streams.open(proxy.port(), completion("a b c", 16, true));
  const auto by_rank = await_inflight(proxy.port(), 2, 5);
  if (policy == "least-tokens") {
    CHECK(by_rank[long_rank] == 1);  // four short requests cost less than the long one's prompt
    // What it counted: the long prompt's ~10,000 tokens plus 16 to generate, still in its prefill.
    const auto m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_rank_tokens_inflight{", {rank_label(long_rank)}) >= 10'000);
    CHECK(metric_sum(m, "dplb_rank_tokens_inflight{", {rank_label(1 - long_rank)}) < 100);
  } else {
    CHECK(by_rank[long_rank] >= 2);  // counted as one request like any other: it shares them 3 and 2
  }
}

TEST_CASE("two dplb replicas: least-load keeps away from a rank the other replica loaded", "[placement][replicas]") {
  const auto policy = GENERATE(as<std::string>{}, "least-load", "least-inflight");
  INFO("replica B: --policy " << policy);
  mock_engine engine(2, {"--itl-ms", "50"});
  // Replica A serves only rank 0's engine (say, another team's share); replica B serves both.
  dplb_proxy replica_a({engine.urls()[0]}, {"--policy", "least-inflight"});
  dplb_proxy replica_b(engine.urls(), {"--policy", policy, "--stats-interval", "50"});
  held_streams streams;
  for (int i = 0; i < 6; ++i) streams.open(replica_a.port(), completion("a b c", 1000, true));
  const double running = await_until([&] { return metric_sum(engine.metrics(0), "vllm:num_requests_running"); },
                                     [](double n) { return n == 6; });
  REQUIRE(running == 6);
  if (policy == "least-load") {
    // B has read rank 0's engine since: it knows of six requests there that it never sent.
    const auto m = await_metrics(replica_b.port(), [](const auto& m) {
      return metric_sum(m, "dplb_engine_running{", {rank_label(0)}) == 6;
    });
    REQUIRE(metric_sum(m, "dplb_engine_running{", {rank_label(0)}) == 6);
  }
  for (int i = 0; i < 4; ++i) streams.open(replica_b.port(), completion("a b c", 1000, true));
  const auto by_rank = await_inflight(replica_b.port(), 2, 4);
  // The engines' totals: 6 from A plus B's share.
  if (policy == "least-load") {
    CHECK(by_rank == std::vector<double>{0, 4});  // engines at 6 and 4
  } else {
    CHECK(by_rank == std::vector<double>{2, 2});  // engines at 8 and 2: B cannot see A's six
  }
}
