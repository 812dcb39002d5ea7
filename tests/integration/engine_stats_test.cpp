// Engine stats: dplb reads every backend's /metrics (one page for all the ranks behind a #dp=N URL),
// exports each rank's numbers, and least-load balances on them without ever trusting them below its own
// counts or failing closed when they are missing, stale or garbage. The numbers are set through the
// mock's admin port, so each test knows exactly what the engines say.

#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;

namespace {

std::string rank_label(int rank) { return "rank=\"" + std::to_string(rank) + "\""; }

double engine_metric(const std::map<std::string, double>& m, const std::string& name, int rank) {
  return metric_sum(m, name + "{", {rank_label(rank)});
}

// The ranks `count` sequential one-token completions through dplb were sent to.
std::multiset<std::string> ranks_of_requests(std::uint16_t port, int count) {
  http_connection client(port);
  std::multiset<std::string> ranks;
  for (int i = 0; i < count; ++i) {
    bhttp::request<bhttp::string_body> request{bhttp::verb::post, "/v1/completions", 11};
    request.set(bhttp::field::content_type, "application/json");
    request.body() = R"({"model":"mock-model","prompt":"x","max_tokens":1})";
    const auto r = client.send(request);
    REQUIRE(r.status == 200);
    ranks.insert(std::string(r.headers["x-dplb-rank"]));
  }
  return ranks;
}

}  // namespace

TEST_CASE("dplb exports each rank's engine stats, a #dp=N server's engines each under its own rank", "[engine-stats]") {
  mock_engine engine(2, {"--dp", "2"});
  const auto urls = engine.urls();
  dplb_proxy proxy({urls[0] + "#dp=2", urls[1] + "#dp=2"}, {"--policy", "least-load", "--stats-interval", "50"});
  engine.override_metrics(0, 1, R"({"running":7,"waiting":3,"kv_cache_usage":0.8})");
  engine.override_metrics(1, 0, R"({"running":2})");
  const auto m = await_metrics(proxy.port(), [](const auto& m) {
    return engine_metric(m, "dplb_engine_running", 1) == 7 && engine_metric(m, "dplb_engine_running", 2) == 2;
  });
  CHECK(engine_metric(m, "dplb_engine_running", 0) == 0);
  CHECK(engine_metric(m, "dplb_engine_running", 1) == 7);  // server 0, engine 1
  CHECK(engine_metric(m, "dplb_engine_waiting", 1) == 3);
  CHECK(engine_metric(m, "dplb_engine_kv_cache_usage", 1) == Approx(0.8));
  CHECK(engine_metric(m, "dplb_engine_running", 2) == 2);  // server 1, engine 0
  CHECK(engine_metric(m, "dplb_engine_running", 3) == 0);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(engine_metric(m, "dplb_engine_stats_age_seconds", r) >= 0);
    CHECK(engine_metric(m, "dplb_engine_stats_age_seconds", r) < 2 * timing_slack());
  }
}

TEST_CASE("least-load steers away from load dplb never sent, where least-inflight cannot see it", "[engine-stats]") {
  const auto policy = GENERATE(as<std::string>{}, "least-load", "least-inflight");
  INFO("--policy " << policy);
  mock_engine engine(4);
  // Rank 0's engine is busy with work that reached it another way (another dplb, a direct client).
  engine.override_metrics(0, 0, R"({"running":50})");
  dplb_proxy proxy(engine.urls(), {"--policy", policy, "--stats-interval", "50"});
  if (policy == "least-load") {
    // Reads are only on for least-load (the default): wait until dplb has one with the load in it.
    await_metrics(proxy.port(), [](const auto& m) { return engine_metric(m, "dplb_engine_running", 0) == 50; });
  }
  const auto ranks = ranks_of_requests(proxy.port(), 9);
  if (policy == "least-load") {
    CHECK(ranks.count("0") == 0);
    for (const std::string r : {"1", "2", "3"}) CHECK(ranks.count(r) == 3);
  } else {
    CHECK(ranks.count("0") >= 2);  // rotation over all four
  }
}

TEST_CASE("missing, garbage and stale engine stats fall back to dplb's own counts and never fail closed",
          "[engine-stats]") {
  mock_engine engine(2);
  // Stale after 3 intervals plus the health-check timeout: 3 * 50 + 100 ms.
  dplb_proxy proxy(engine.urls(), {"--policy", "least-load", "--stats-interval", "50", "--health-check-timeout-ms", "100"});
  engine.override_metrics(0, 0, R"({"running":50})");
  await_metrics(proxy.port(), [](const auto& m) { return engine_metric(m, "dplb_engine_running", 0) == 50; });
  CHECK(ranks_of_requests(proxy.port(), 4).count("0") == 0);

  // Rank 0's page turns to garbage: no usable number, a NaN, a label set that never ends, a negative.
  engine.serve_raw_metrics(0, "garbage\n"
                              "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} NaN\n"
                              "vllm:num_requests_waiting{engine=\"0\" 3\n"
                              "vllm:num_requests_waiting{engine=\"0\"} -4\n"
                              "\x01\x02\xff\n");
  // The last good numbers age out, and then the rank is balanced on dplb's counts again.
  const auto m = await_metrics(proxy.port(), [](const auto& m) {
    return engine_metric(m, "dplb_engine_stats_age_seconds", 0) > 0.3;
  });
  REQUIRE(engine_metric(m, "dplb_engine_stats_age_seconds", 0) > 0.3);
  CHECK(engine_metric(m, "dplb_engine_running", 0) == 50);  // what was last read, still shown with its age
  const auto ranks = ranks_of_requests(proxy.port(), 4);
  CHECK(ranks.count("0") == 2);
  CHECK(ranks.count("1") == 2);
  CHECK(proxy.process().running());
}

TEST_CASE("one health probe per URL speaks for every rank behind it", "[engine-stats][health]") {
  mock_engine engine(2, {"--dp", "3"});
  const auto urls = engine.urls();
  dplb_proxy proxy({urls[0] + "#dp=3", urls[1]}, {"--health-check-interval-ms", "50", "--unhealthy-threshold", "1",
                                                 "--healthy-threshold", "1"});
  engine.set_fault(0, R"({"health_status": 503})");
  auto m = await_metrics(proxy.port(), [](const auto& m) {
    return metric_sum(m, "dplb_rank_healthy{", {rank_label(0)}) + metric_sum(m, "dplb_rank_healthy{", {rank_label(1)}) +
               metric_sum(m, "dplb_rank_healthy{", {rank_label(2)}) == 0;
  });
  for (int r = 0; r < 3; ++r) CHECK(metric_sum(m, "dplb_rank_healthy{", {rank_label(r)}) == 0);
  CHECK(metric_sum(m, "dplb_rank_healthy{", {rank_label(3)}) == 1);
  // Every request now goes to the one healthy rank.
  const auto ranks = ranks_of_requests(proxy.port(), 3);
  CHECK(ranks.count("3") == 3);
  // One probe per URL: the server with three ranks was asked no more often than the plain one.
  const double probes_dp = metric_sum(engine.metrics(0), "mock_health_checks_total");
  const double probes_plain = metric_sum(engine.metrics(1), "mock_health_checks_total");
  CHECK(probes_dp <= probes_plain + 1);
  engine.clear_fault(0);
  m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_healthy{") == 4; });
  CHECK(metric_sum(m, "dplb_rank_healthy{") == 4);
}
