// The simulated engine's --start-after, which bench/imbalance.sh relies on for a burst's t=0: no step
// may run before the last request of the burst arrives, and then every request runs.

#include <catch2/catch.hpp>

#include <memory>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using namespace std::chrono_literals;

TEST_CASE("the simulated engine holds its steps until --start-after requests have arrived", "[mock]") {
  mock_engine engine(2, {"--simulate", "--dp-lockstep", "--time-scale", "100", "--start-after", "3"});
  const auto steps = [&] { return metric_sum(engine.metrics(0), "mock_steps_total"); };
  const auto received = [&] {
    return metric_sum(engine.metrics(0), "mock_requests_received_total") +
           metric_sum(engine.metrics(1), "mock_requests_received_total");
  };
  const std::string body = R"({"prompt":"a b","max_tokens":4})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              "Content-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<std::unique_ptr<http_connection>> clients;
  for (const std::size_t rank : {0, 1}) {
    clients.push_back(std::make_unique<http_connection>(engine.ports()[rank]));
    clients.back()->write_raw(request);
  }
  REQUIRE(await_until(received, [](double n) { return n == 2; }) == 2);
  // Unheld, the first step would begin within a turn of the event loop: give it ample time to (wrongly) run.
  CHECK(await_until(steps, [](double n) { return n > 0; }, 300ms) == 0);

  clients.push_back(std::make_unique<http_connection>(engine.ports()[0]));
  clients.back()->write_raw(request);
  for (auto& client : clients) {
    const auto answer = client->read_until_close(5s);
    CHECK(answer.find("HTTP/1.1 200 OK") == 0);
    CHECK(answer.find("\"completion_tokens\":4") != std::string::npos);
  }
  CHECK(steps() >= 4);  // 4 tokens each, all started together: prefill + decodes
}

// The simulated KV cache over the wire: a prompt sent again finds its full blocks cached (the
// vllm:prefix_cache_* counters, in tokens, as vLLM counts them), and a request longer than the whole
// cache gets vLLM's 400 instead of waiting for ever.
TEST_CASE("the simulated engine caches prompt prefixes and refuses a context above its cache", "[mock]") {
  mock_engine engine(1, {"--simulate", "--time-scale", "100", "--kv-blocks", "64", "--block-size", "16"});
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "w" + std::to_string(i) + " ";
  const std::string body = R"({"prompt":")" + prompt + R"(","max_tokens":2})";
  for (int round = 0; round < 2; ++round) {
    const auto answer = http_post_json(engine.ports()[0], "/v1/completions", body);
    REQUIRE(answer.status == 200);
  }
  const auto metrics = engine.metrics(0);
  // 40 tokens queried each time; the second time its 2 full blocks (32 tokens) were cached.
  CHECK(metric_sum(metrics, "vllm:prefix_cache_queries_total") == 80);
  CHECK(metric_sum(metrics, "vllm:prefix_cache_hits_total") == 32);
  CHECK(metric_sum(metrics, "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\"") == 1);
  CHECK(metric_sum(metrics, "vllm:num_preemptions_total") == 0);

  // 64 blocks of 16 hold 1,024 tokens: 40 + 1,000 do not fit.
  const auto refused = http_post_json(engine.ports()[0], "/v1/completions",
                                      R"({"prompt":")" + prompt + R"(","max_tokens":1000})");
  CHECK(refused.status == 400);
  CHECK(refused.body.find("maximum context length is 1024 tokens") != std::string::npos);
}
