// In-flight accounting and metric values: what dplb counts must match what happened on the wire.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <sstream>
#include <thread>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

bhttp::request<bhttp::string_body> completion(int max_tokens, bool stream, const std::string& prompt,
                                              const std::string& endpoint = "/v1/completions") {
  json body{{"max_tokens", max_tokens}, {"stream", stream}};
  if (endpoint == "/v1/completions") body["prompt"] = prompt;
  else body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  if (stream) body["stream_options"] = {{"include_usage", true}};
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, endpoint, 11};
  r.set(bhttp::field::content_type, "application/json");
  r.body() = body.dump();
  return r;
}


double inflight_total(const std::map<std::string, double>& m) { return metric_sum(m, "dplb_rank_inflight{"); }

}  // namespace

TEST_CASE("metric values after a known run", "[metrics]") {
  mock_engine engine(4);
  dplb_proxy proxy(engine.urls(), {"--policy", "round-robin"});
  http_connection client(proxy.port());
  // 16 requests in sequence, round-robin: each rank gets 2 of each kind. Prompt "w1 .. w5" is 5 words
  // = 5 prompt tokens at the mock; max_tokens 3 = 3 completion tokens.
  const std::string prompt = "w1 w2 w3 w4 w5";
  for (int i = 0; i < 4; ++i) {
    for (auto [stream, endpoint] : {std::pair{false, "/v1/completions"}, std::pair{true, "/v1/completions"},
                                    std::pair{false, "/v1/chat/completions"}, std::pair{true, "/v1/chat/completions"}}) {
      auto r = stream ? client.send_streaming(completion(3, stream, prompt, endpoint))
                      : client.send(completion(3, stream, prompt, endpoint));
      REQUIRE(r.status == 200);
      REQUIRE(r.complete);
    }
  }
  auto m = scrape_metrics(proxy.port());
  for (int rank = 0; rank < 4; ++rank) {
    const std::string label = "rank=\"" + std::to_string(rank) + "\"";
    INFO("rank " << rank);
    CHECK(metric_sum(m, "dplb_requests_total{", {label, "code=\"200\""}) == 4);
    CHECK(metric_sum(m, "dplb_prompt_tokens_total{", {label}) == 4 * 5);
    CHECK(metric_sum(m, "dplb_completion_tokens_total{", {label}) == 4 * 3);
    CHECK(metric_sum(m, "dplb_request_duration_seconds_count{", {label}) == 4);
    CHECK(metric_sum(m, "dplb_time_to_first_byte_seconds_count{", {label}) == 4);
    CHECK(metric_sum(m, "dplb_rank_inflight{", {label}) == 0);
    // The engine's own counters agree with dplb's view of the same rank.
    auto engine_metrics = scrape_metrics(engine.ports()[rank]);
    CHECK(metric_sum(engine_metrics, "vllm:prompt_tokens_total") == 4 * 5);
    CHECK(metric_sum(engine_metrics, "vllm:generation_tokens_total") == 4 * 3);
  }
  CHECK(metric_sum(m, "dplb_inflight_skew") == 0);
  CHECK(metric_sum(m, "dplb_build_info{", {"policy=\"round-robin\""}) == 1);
}

TEST_CASE("in-flight returns to 0 when the client closes mid-stream, and the engine sees the abort", "[accounting]") {
  mock_engine engine(1, {"--itl-ms", "50"});
  dplb_proxy proxy(engine.urls());
  {
    http_connection client(proxy.port());
    auto request = completion(200, true, "x");
    client.write_raw([&] {
      request.set(bhttp::field::host, "x");
      request.prepare_payload();
      std::ostringstream os;
      os << request;
      return os.str();
    }());
    // Wait until the stream is running: the engine counts the request and dplb holds the slot.
    auto busy = await_metrics(proxy.port(), [](const auto& m) { return inflight_total(m) == 1; });
    REQUIRE(inflight_total(busy) == 1);
  }  // the client goes away mid-stream
  auto m = await_metrics(proxy.port(), [](const auto& m) { return inflight_total(m) == 0; });
  CHECK(inflight_total(m) == 0);
  CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"499\""}) == 1);
  auto engine_metrics = await_metrics(engine.ports()[0], [](const auto& e) {
    return metric_sum(e, "mock_requests_aborted_total") == 1;
  });
  CHECK(metric_sum(engine_metrics, "mock_requests_aborted_total") == 1);
}

TEST_CASE("in-flight returns to 0 when the engine dies mid-stream, and the client sees a truncated stream", "[accounting]") {
  auto engine = std::make_unique<mock_engine>(1, std::vector<std::string>{"--itl-ms", "50"});
  dplb_proxy proxy(engine->urls());
  http_connection client(proxy.port());
  std::thread killer([&] {
    // Kill the engine once the stream is under way.
    auto busy = await_metrics(proxy.port(), [](const auto& m) { return inflight_total(m) == 1; });
    if (inflight_total(busy) == 1) std::this_thread::sleep_for(120ms);  // a few events have flowed
    engine->process().stop(SIGKILL);
  });
  auto r = client.send_streaming(completion(1000, true, "x"), 10s);
  killer.join();
  CHECK(r.status == 200);
  CHECK_FALSE(r.complete);  // the chunked stream ended without its last chunk
  CHECK(r.body.find("data: {") != std::string::npos);
  auto m = await_metrics(proxy.port(), [](const auto& m) { return inflight_total(m) == 0; });
  CHECK(inflight_total(m) == 0);
  CHECK(metric_sum(m, "dplb_upstream_errors_total{", {"kind=\"midstream\""}) == 1);
}

TEST_CASE("an engine that is down gets a 502 in OpenAI's error shape and frees the slot", "[accounting]") {
  std::vector<std::string> urls;
  {
    mock_engine engine(1);
    urls = engine.urls();
  }  // stopped: its port now refuses connections
  dplb_proxy proxy(urls);
  auto r = http_post_json(proxy.port(), "/v1/completions", R"({"prompt":"x","max_tokens":1})");
  CHECK(r.status == 502);
  auto body = json::parse(r.body);
  CHECK(body["error"]["code"] == 502);
  CHECK(body["error"]["message"].get<std::string>().find(urls[0]) != std::string::npos);
  auto m = scrape_metrics(proxy.port());
  CHECK(inflight_total(m) == 0);
  CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"502\""}) == 1);
}
