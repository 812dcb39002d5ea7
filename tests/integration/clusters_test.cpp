// Clusters (the config file's "clusters", one per set of models) against the real dplb and mock engines: the body's model
// picks the cluster, each cluster balances its own ranks under its own policy, a request without a model goes
// to the default cluster, an unknown model gets vLLM's 404, GET /v1/models answers the union, pinning stays
// within the model's cluster, and a cluster whose ranks are all out answers 503 while the others serve.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>

#include <map>
#include <optional>
#include <regex>
#include <string>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "temp_file.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::string llama = "meta-llama/Llama-3.1-8B-Instruct";
const std::string qwen = "Qwen/Qwen3-30B-A3B";

// Two engine servers, each answering only for its own model (as vLLM does): ranks 0 and 1 serve llama
// (round-robin, the default cluster), rank 2 serves qwen.
struct two_models {
  mock_engine llama_engine{2, {"--model", llama}};
  mock_engine qwen_engine{1, {"--model", qwen}};
  json config() const {
    const auto l = llama_engine.urls();
    return json{{"clusters",
                 {{{"name", "llama"}, {"models", {llama}}, {"policy", "round-robin"}, {"backends", {l[0], l[1]}},
                   {"default", true}},
                  {{"name", "qwen"}, {"models", {qwen}}, {"backends", {qwen_engine.urls()[0]}}}}}};
  }
};

http_response complete(http_connection& client, const std::optional<std::string>& model,
                       const std::optional<std::string>& pin = std::nullopt) {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::content_type, "application/json");
  r.set(bhttp::field::host, "dplb");
  if (pin) r.set("X-data-parallel-rank", *pin);
  json body{{"prompt", "a b c"}, {"max_tokens", 1}};
  if (model) body["model"] = *model;
  r.body() = body.dump();
  r.prepare_payload();
  return client.send(r);
}

std::map<std::string, int> ranks_for(std::uint16_t port, const std::optional<std::string>& model, int n) {
  http_connection client(port);
  std::map<std::string, int> ranks;
  for (int i = 0; i < n; ++i) {
    const auto r = complete(client, model);
    REQUIRE(r.status == 200);
    ++ranks[std::string(r.headers["x-dplb-rank"])];
  }
  return ranks;
}

}  // namespace

TEST_CASE("the body's model picks the cluster, and each cluster balances its own ranks", "[clusters]") {
  two_models engines;
  temp_file config(engines.config().dump());
  dplb_proxy proxy({}, {"--config", config.path(), "--threads", "2"});
  REQUIRE(proxy.process().wait_for_line(std::regex("cluster qwen: policy=least-inflight ranks=2 models=Qwen/Qwen3-30B-A3B"), 5s));

  CHECK(ranks_for(proxy.port(), llama, 6) == std::map<std::string, int>{{"0", 3}, {"1", 3}});
  CHECK(ranks_for(proxy.port(), qwen, 3) == std::map<std::string, int>{{"2", 3}});
  // No model: the default cluster.
  CHECK(ranks_for(proxy.port(), std::nullopt, 4) == std::map<std::string, int>{{"0", 2}, {"1", 2}});

  // A model no cluster serves: vLLM's own 404, from dplb, and the connection stays open.
  http_connection client(proxy.port());
  const auto unknown = complete(client, "gpt-4");
  CHECK(unknown.status == 404);
  CHECK(json::parse(unknown.body) ==
        json::parse(R"({"error":{"message":"The model `gpt-4` does not exist.","type":"NotFoundError","param":"model","code":404}})"));
  CHECK(complete(client, qwen).status == 200);
  const auto metrics = scrape_metrics(proxy.port());
  CHECK(metric_sum(metrics, "dplb_rejected_requests_total{", {"code=\"404\""}) == 1);
  CHECK(metric_sum(metrics, "dplb_rank_cluster{", {"cluster=\"llama\""}) == 2);
  CHECK(metric_sum(metrics, "dplb_rank_cluster{", {"cluster=\"qwen\"", "rank=\"2\""}) == 1);
}

TEST_CASE("GET /v1/models answers every cluster's models, and pinning stays within the model's cluster", "[clusters]") {
  two_models engines;
  temp_file config(engines.config().dump());
  dplb_proxy proxy({}, {"--config", config.path()});
  http_connection client(proxy.port());

  bhttp::request<bhttp::string_body> list{bhttp::verb::get, "/v1/models", 11};
  list.set(bhttp::field::host, "dplb");
  const auto models = client.send(list);
  REQUIRE(models.status == 200);
  const auto doc = json::parse(models.body);
  CHECK(doc["object"] == "list");
  REQUIRE(doc["data"].size() == 2);
  CHECK(doc["data"][0]["id"] == llama);
  CHECK(doc["data"][1]["id"] == qwen);
  CHECK(doc["data"][1]["object"] == "model");
  CHECK(doc["data"][1]["owned_by"] == "vllm");
  CHECK(models.headers["x-dplb-rank"] == "");  // dplb's own answer

  // Rank 2 serves qwen: pinned there, a qwen request goes; a llama request is refused; no model follows the pin.
  auto pinned = complete(client, qwen, "2");
  CHECK(pinned.status == 200);
  CHECK(pinned.headers["x-dplb-rank"] == "2");
  const auto wrong = complete(client, llama, "2");
  CHECK(wrong.status == 400);
  CHECK_THAT(std::string(json::parse(wrong.body)["error"]["message"]), Catch::Contains("not a rank of the cluster"));
  pinned = complete(client, std::nullopt, "2");
  CHECK(pinned.status == 200);
  CHECK(pinned.headers["x-dplb-rank"] == "2");
}

TEST_CASE("without clusters dplb neither reads the model nor answers /v1/models itself", "[clusters]") {
  mock_engine engine(2);
  dplb_proxy proxy(engine.urls(), {"--policy", "round-robin", "--threads", "1"});
  // A model the engines do not serve reaches an engine, which answers the 404 itself.
  http_connection client(proxy.port());
  const auto unknown = complete(client, "any-model-at-all");
  CHECK(unknown.status == 404);
  CHECK(unknown.headers["x-dplb-rank"] == "0");
  // The engine's own /v1/models comes back.
  bhttp::request<bhttp::string_body> list{bhttp::verb::get, "/v1/models", 11};
  list.set(bhttp::field::host, "dplb");
  const auto models = client.send(list);
  CHECK(models.status == 200);
  CHECK(models.headers["x-dplb-rank"] == "1");
}

TEST_CASE("a cluster whose ranks are all down answers 503 while the other clusters serve", "[clusters]") {
  two_models engines;
  temp_file config(engines.config().dump());
  // Queueing on, so that a refusal has two possible reasons: a full queue (429) or no usable rank (503).
  dplb_proxy proxy({}, {"--config", config.path(), "--max-inflight-per-rank", "1", "--health-check-interval-ms", "100",
                        "--unhealthy-threshold", "1"});
  REQUIRE(engines.qwen_engine.process().stop(SIGTERM).has_value());
  await_metrics(proxy.port(), [](const std::map<std::string, double>& m) {
    return metric_sum(m, "dplb_rank_healthy{", {"rank=\"2\""}) == 0;
  });
  http_connection client(proxy.port());
  const auto refused = complete(client, qwen);
  CHECK(refused.status == 503);
  CHECK_THAT(std::string(json::parse(refused.body)["error"]["message"]), Catch::Contains("cluster"));
  CHECK(complete(client, llama).status == 200);
}
