// The point of dplb: a burst of uniform requests is spread exactly over the ranks, whatever the policy
// and the number of worker threads, as seen by the client (x-dplb-rank), by dplb's metrics and by the
// engines themselves.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "http_client.hpp"
#include "loadgen.hpp"
#include "processes.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using namespace std::chrono_literals;

namespace {

// least-tokens estimates a text prompt's tokens from its length: prompts of a few short random words
// differ by half their size from one request to the next, and least-tokens balances those differences.
// A benchmark's prompts (vllm bench serve: 1,024 tokens) differ by a few percent, which it treats as a tie.
std::size_t uniform_prompt_words(const std::string& policy) {
  return policy == "least-tokens" || policy == "prefix-aware" ? 256 : 8;  // prefix-aware: prompts long enough to hash
}

dplb::loadgen::run_options burst_of(std::size_t requests, std::uint16_t port, std::size_t prompt_words = 8) {
  dplb::loadgen::run_options o;
  o.port = port;
  o.num_prompts = requests;  // request_rate = inf: every request at t=0, one connection each
  o.shape.input_len = prompt_words;
  o.shape.output_len = 4;
  o.shape.model = "mock-model";
  o.timeout = 60s;
  return o;
}

std::size_t spread_of(const std::vector<double>& counts) {
  auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
  return static_cast<std::size_t>(*hi - *lo);
}

// Each run takes a second (eight under TSan) for its first token: the policies are split over two test
// cases so that neither nears CTest's timeout under a sanitizer.
void check_burst(const std::string& policy, const std::string& threads, std::size_t burst);

}  // namespace

TEST_CASE("a burst is spread exactly over 4 ranks", "[burst]") {
  const auto policy = GENERATE(as<std::string>{}, "round-robin", "least-inflight");
  const auto threads = GENERATE(as<std::string>{}, "1", "2");
  const std::size_t burst = GENERATE(256u, 250u);
  check_burst(policy, threads, burst);
}

TEST_CASE("a burst is spread exactly over 4 ranks by the engine- and token-aware policies", "[burst]") {
  // least-load reads the engines' /metrics every 100 ms while the burst is in flight: the reads must not
  // disturb it. least-tokens weighs each request by its tokens: uniform requests, uniform weights.
  const auto policy = GENERATE(as<std::string>{}, "least-load", "least-tokens", "prefix-aware");
  const auto threads = GENERATE(as<std::string>{}, "1", "2");
  const std::size_t burst = GENERATE(256u, 250u);
  check_burst(policy, threads, burst);
}

namespace {

void check_burst(const std::string& policy, const std::string& threads, std::size_t burst) {
  // A second to the first token: the whole burst is in flight at once, as at a benchmark's start.
  // (Longer under sanitizers: dplb must have placed every request before the first one finishes.)
  const auto ttft_ms = std::to_string(static_cast<int>(1000 * timing_slack()));
  mock_engine engine(4, {"--ttft-ms", ttft_ms, "--itl-ms", "5"});
  dplb_proxy proxy(engine.urls(), {"--policy", policy, "--threads", threads});

  auto report = dplb::loadgen::run(burst_of(burst, proxy.port(), uniform_prompt_words(policy)));
  INFO(policy << ", " << threads << " thread(s), burst of " << burst << "; " << report.error);
  REQUIRE(report.succeeded() == burst);
  const auto summary = dplb::loadgen::summarize(report);
  REQUIRE(summary.peak_concurrency == burst);  // it really was a burst: every request in flight at once

  // Seen by the client.
  std::vector<double> client_counts, proxy_counts, engine_counts;
  for (int rank = 0; rank < 4; ++rank) {
    client_counts.push_back(static_cast<double>(report.rank_counts()[rank]));
  }
  // Seen by dplb's metrics and by each engine.
  auto m = scrape_metrics(proxy.port());
  for (int rank = 0; rank < 4; ++rank) {
    proxy_counts.push_back(metric_sum(m, "dplb_requests_total{", {"rank=\"" + std::to_string(rank) + "\""}));
    engine_counts.push_back(metric_sum(scrape_metrics(engine.ports()[rank]), "vllm:request_success_total"));
  }
  CHECK(client_counts == proxy_counts);
  CHECK(client_counts == engine_counts);
  if (burst % 4 == 0) {
    CHECK(client_counts == std::vector<double>(4, static_cast<double>(burst / 4)));
  } else {
    CHECK(spread_of(client_counts) <= 1);
  }
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
  CHECK(metric_sum(m, "dplb_inflight_skew") == 0);
}

}  // namespace

TEST_CASE("a burst through one URL with #dp=4 is spread exactly over the engines behind it", "[burst][dp]") {
  const auto policy = GENERATE(as<std::string>{}, "least-inflight", "least-load", "least-tokens");
  INFO(policy);
  const auto ttft_ms = std::to_string(static_cast<int>(1000 * timing_slack()));
  mock_engine engine(1, {"--dp", "4", "--ttft-ms", ttft_ms, "--itl-ms", "5"});
  dplb_proxy proxy({engine.urls()[0] + "#dp=4"}, {"--policy", policy, "--threads", "2"});
  auto report = dplb::loadgen::run(burst_of(256, proxy.port(), uniform_prompt_words(policy)));
  REQUIRE(report.succeeded() == 256);
  REQUIRE(dplb::loadgen::summarize(report).peak_concurrency == 256);
  // The engines' own count of what reached each of them, and through which X-data-parallel-rank.
  const auto stats = nlohmann::json::parse(engine.stats());
  const auto& engines = stats["ports"][0]["engines"];
  REQUIRE(engines.size() == 4);
  for (const auto& e : engines) {
    INFO("engine " << e["engine"]);
    CHECK(e["requests_routed"] == 64);
    CHECK(e["requests_routed_by_header"] == 64);  // every one named its engine: none left to the server
  }
}

TEST_CASE("2000 concurrent streams through one dplb all complete", "[burst][scale]") {
  mock_engine engine(4, {"--ttft-ms", "200", "--itl-ms", "20"});
  // Round-robin: 2000 connections take a while to open, so early streams may end before the last start,
  // and only strict rotation then guarantees exactly 500 each (least-inflight balances what is in flight).
  dplb_proxy proxy(engine.urls(), {"--threads", "1", "--policy", "round-robin"});
  const long rss_before = proxy.process().rss_kib();
  auto options = burst_of(2000, proxy.port());
  options.shape.output_len = 16;
  auto report = dplb::loadgen::run(options);
  const auto summary = dplb::loadgen::summarize(report);
  INFO(report.error);
  CHECK(report.succeeded() == 2000);
  CHECK(summary.peak_concurrency >= 1500);
  CHECK(summary.total_output_tokens == 2000u * 16u);
  for (const auto& [rank, count] : summary.per_rank) CHECK(count == 500);
  const long peak_rss = proxy.process().peak_rss_kib();
  WARN("dplb with 2000 concurrent streams: peak RSS " << peak_rss / 1024.0 << " MiB (idle " << rss_before / 1024.0
                                                      << " MiB), " << (peak_rss - rss_before) / 2000.0
                                                      << " KiB per stream");
  auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
  CHECK(metric_sum(m, "dplb_completion_tokens_total{") == 2000.0 * 16);
}
