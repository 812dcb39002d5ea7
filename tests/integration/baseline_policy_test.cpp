// The engine-stats baseline: dplb polls the engines' /metrics for it (by default, for no policy that does
// not use them), and its picks follow what the engines report. The same run under dplb's default policy
// shows the contrast.

#include <catch2/catch.hpp>

#include <memory>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;

namespace {

std::string completion_body(int max_tokens, bool stream) {
  return std::string(R"({"prompt":"x","max_tokens":)") + std::to_string(max_tokens) +
         (stream ? R"(,"stream":true})" : "}");
}

double engine_gauge(const mock_engine& engine, std::size_t rank, const std::string& name) {
  return metric_sum(engine.metrics(rank), name);  // through the admin port: not a scrape of the rank
}

}  // namespace

TEST_CASE("engine-stats follows the load the engines report, and dplb's own policies never poll them", "[baseline]") {
  const auto policy = GENERATE(as<std::string>{}, "engine-stats", "least-inflight");
  INFO("--policy " << policy);
  mock_engine engine(2, {"--itl-ms", "50"});
  // Only the baseline gets a faster refresh; least-inflight runs with the default, which reads nothing.
  std::vector<std::string> args{"--policy", policy};
  if (policy == "engine-stats") args.insert(args.end(), {"--stats-interval", "20ms"});
  dplb_proxy proxy(engine.urls(), args);

  // Eight long streams straight to rank 0, behind dplb's back: its engine reports 8 running requests.
  std::vector<std::unique_ptr<http_connection>> direct;
  for (int i = 0; i < 8; ++i) {
    direct.push_back(std::make_unique<http_connection>(engine.ports()[0]));
    const auto body = completion_body(1000, true);
    direct.back()->write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  const auto running = await_until([&] { return engine_gauge(engine, 0, "vllm:num_requests_running"); },
                                   [](double n) { return n == 8; });
  REQUIRE(running == 8);

  if (policy == "engine-stats") {
    // The poller reads rank 0 then rank 1, then publishes. Three more scrapes of rank 1 than now means
    // a whole poll that began after the streams were running has been published.
    const double before = engine_gauge(engine, 1, "mock_metrics_scrapes_total");
    const double after = await_until([&] { return engine_gauge(engine, 1, "mock_metrics_scrapes_total"); },
                                     [&](double n) { return n >= before + 3; });
    REQUIRE(after >= before + 3);
  }

  std::vector<std::string> ranks;
  http_connection client(proxy.port());
  for (int i = 0; i < 2; ++i) {
    bhttp::request<bhttp::string_body> request{bhttp::verb::post, "/v1/completions", 11};
    request.set(bhttp::field::content_type, "application/json");
    request.body() = completion_body(1, false);
    const auto r = client.send(request);
    REQUIRE(r.status == 200);
    ranks.emplace_back(r.headers["x-dplb-rank"]);
  }
  if (policy == "engine-stats") {
    // Scores 4*waiting+running: rank 0 reports 8, rank 1 0 and then 4 with the local pick counted.
    CHECK(ranks == std::vector<std::string>{"1", "1"});
  } else {
    // dplb knows of no request on either rank (the streams never went through it): plain rotation.
    CHECK(ranks == std::vector<std::string>{"0", "1"});
    CHECK(engine_gauge(engine, 0, "mock_metrics_scrapes_total") == 0);
    CHECK(engine_gauge(engine, 1, "mock_metrics_scrapes_total") == 0);
  }
}
