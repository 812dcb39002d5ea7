// Prefill/decode roles end to end: one prefill mock process and one decode mock process, run in two legs
// as vLLM's disaggregated router does. Waits are on /metrics (await_metrics), never on time.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using json = nlohmann::json;

namespace {

const std::string held_key = "mock_kv_blocks_held{engine=\"0\"}";
const std::string expired_key = "mock_kv_holds_expired_total{engine=\"0\"}";
const std::string transfers_key = "mock_kv_transfers_total{engine=\"0\"}";
const std::string errors_key = "mock_kv_transfer_errors_total{engine=\"0\"}";

// 40 words: 3 synthetic blocks of 16 tokens.
std::string long_prompt() {
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += (i == 0 ? "w" : " w") + std::to_string(i);
  return prompt;
}

bhttp::request<bhttp::string_body> post(const std::string& target, const json& body, const std::string& request_id) {
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, target, 11};
  req.set(bhttp::field::content_type, "application/json");
  if (!request_id.empty()) req.set("X-Request-Id", request_id);
  req.body() = body.dump();
  return req;
}

// Leg 1 as vLLM's router sends it: the client's body, stream false, max_tokens 1, do_remote_decode.
json leg1(json client) {
  client["stream"] = false;
  client["max_tokens"] = 1;
  client["kv_transfer_params"] = {{"do_remote_decode", true}, {"do_remote_prefill", false},
                                  {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                  {"remote_host", nullptr}, {"remote_port", nullptr}};
  return client;
}

// Leg 2: the client's body as it was, plus the prefill answer's kv_transfer_params verbatim.
json leg2(json client, const json& prefill_answer) {
  client["kv_transfer_params"] = prefill_answer.at("kv_transfer_params");
  return client;
}

http_response send(std::uint16_t port, bhttp::request<bhttp::string_body> req) {
  http_connection connection(port);
  return connection.send(std::move(req));
}

json run_leg1(const mock_engine& prefill, const json& client, const std::string& request_id,
              const std::string& path = "/v1/completions") {
  const auto r = send(prefill.ports()[0], post(path, leg1(client), request_id));
  REQUIRE(r.status == 200);
  return json::parse(r.body);
}

}  // namespace

TEST_CASE("mock pd: leg 1 answers kv_transfer_params and holds the blocks, leg 2 pulls them and streams",
          "[mock][pd]") {
  mock_engine prefill(1, {"--kv-role", "prefill"});
  mock_engine decode(1, {"--kv-role", "decode", "--kv-transfer-us-per-block", "100"});
  const json client = {{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 3}, {"stream", true}};

  const auto answer = run_leg1(prefill, client, "req-1");
  CHECK(answer["object"] == "text_completion");
  CHECK(answer["usage"]["completion_tokens"] == 1);
  CHECK(answer["usage"]["prompt_tokens"] == 40);
  const auto& kv = answer["kv_transfer_params"];
  CHECK(kv["do_remote_prefill"] == true);
  CHECK(kv["do_remote_decode"] == false);
  CHECK(kv["remote_block_ids"].size() == 3);
  CHECK(kv["remote_engine_id"].get<std::string>().rfind("mock-", 0) == 0);
  CHECK(kv["remote_request_id"].get<std::string>().rfind("req-1-", 0) == 0);
  CHECK(kv["remote_host"] == "127.0.0.1");
  CHECK(kv["remote_port"] == prefill.ports()[0]);
  CHECK(kv["tp_size"] == 1);
  CHECK(scrape_metrics(prefill.ports()[0]).at(held_key) == 3);

  http_connection connection(decode.ports()[0]);
  const auto r = connection.send_streaming(post("/v1/completions", leg2(client, answer), "req-1"));
  REQUIRE(r.status == 200);
  CHECK(r.headers[bhttp::field::content_type].starts_with("text/event-stream"));
  CHECK(r.body.find("data: [DONE]") != std::string::npos);
  CHECK(r.body.find("\"finish_reason\":\"length\"") != std::string::npos);
  const auto m = await_metrics(prefill.ports()[0], [](const auto& m) { return m.at(held_key) == 0; });
  CHECK(m.at(held_key) == 0);
  CHECK(m.at(expired_key) == 0);
  const auto d = scrape_metrics(decode.ports()[0]);
  CHECK(d.at(transfers_key) == 1);
  CHECK(d.at(errors_key) == 0);

  SECTION("a second decode with the same params gets vLLM's 400: the blocks were read") {
    const auto again = send(decode.ports()[0], post("/v1/completions", leg2(client, answer), "req-1"));
    CHECK(again.status == 400);
    const auto body = json::parse(again.body);
    CHECK(body["error"]["type"] == "BadRequestError");
    CHECK(body["error"]["code"] == 400);
    CHECK(body["error"]["message"].get<std::string>().find("KV transfer") != std::string::npos);
    const auto after = scrape_metrics(decode.ports()[0]);
    CHECK(after.at(transfers_key) == 1);
    CHECK(after.at(errors_key) == 1);
  }
}

TEST_CASE("mock pd: chat legs, non-streaming decode, and requests without kv_transfer_params served whole",
          "[mock][pd]") {
  mock_engine prefill(1, {"--kv-role", "prefill"});
  mock_engine decode(1, {"--kv-role", "decode"});
  const json client = {{"model", "mock-model"},
                       {"messages", {{{"role", "user"}, {"content", "hello there"}}}},
                       {"max_tokens", 2}};
  const auto answer = run_leg1(prefill, client, "", "/v1/chat/completions");
  CHECK(answer["object"] == "chat.completion");
  CHECK(answer["kv_transfer_params"]["remote_block_ids"].size() == 1);
  CHECK(answer["kv_transfer_params"]["remote_request_id"].get<std::string>().rfind("prefill-", 0) == 0);
  const auto r = send(decode.ports()[0], post("/v1/chat/completions", leg2(client, answer), ""));
  REQUIRE(r.status == 200);
  const auto body = json::parse(r.body);
  CHECK(body["usage"]["completion_tokens"] == 2);
  CHECK_FALSE(body.contains("kv_transfer_params"));
  CHECK(await_metrics(prefill.ports()[0], [](const auto& m) { return m.at(held_key) == 0; }).at(held_key) == 0);

  // Co-located fallback: either role serves a plain request, holding nothing.
  for (const auto* mock : {&prefill, &decode}) {
    const auto plain = send(mock->ports()[0], post("/v1/chat/completions", client, ""));
    REQUIRE(plain.status == 200);
    CHECK_FALSE(json::parse(plain.body).contains("kv_transfer_params"));
  }
  CHECK(scrape_metrics(prefill.ports()[0]).at(held_key) == 0);
  CHECK(scrape_metrics(decode.ports()[0]).at(transfers_key) == 1);
}

TEST_CASE("mock pd: an unread hold expires after --kv-hold-timeout-ms", "[mock][pd]") {
  mock_engine prefill(1, {"--kv-role", "prefill", "--kv-hold-timeout-ms", "200"});
  mock_engine decode(1, {"--kv-role", "decode"});
  const json client = {{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 2}};
  const auto answer = run_leg1(prefill, client, "late");
  CHECK(scrape_metrics(prefill.ports()[0]).at(held_key) == 3);
  const auto m = await_metrics(prefill.ports()[0], [](const auto& m) { return m.at(expired_key) == 1; });
  CHECK(m.at(expired_key) == 1);
  CHECK(m.at(held_key) == 0);
  // Too late: the blocks are gone.
  const auto r = send(decode.ports()[0], post("/v1/completions", leg2(client, answer), "late"));
  CHECK(r.status == 400);
  CHECK(scrape_metrics(decode.ports()[0]).at(errors_key) == 1);
}

TEST_CASE("mock pd: /internal/kv-pull answers 404 in vLLM's shape for an unknown hold, 400 for a bad body",
          "[mock][pd]") {
  mock_engine prefill(1, {"--kv-role", "prefill"});
  auto r = http_post_json(prefill.ports()[0], "/internal/kv-pull",
                          R"({"remote_engine_id":"mock-1-0","remote_request_id":"nope"})");
  CHECK(r.status == 404);
  const auto body = json::parse(r.body);
  CHECK(body["error"]["type"] == "NotFoundError");
  CHECK(body["error"]["code"] == 404);
  r = http_post_json(prefill.ports()[0], "/internal/kv-pull", R"({"remote_engine_id":"x"})");
  CHECK(r.status == 400);
  // Without --kv-role the path does not exist, as before.
  mock_engine plain(1);
  r = http_post_json(plain.ports()[0], "/internal/kv-pull", R"({"remote_engine_id":"x","remote_request_id":"y"})");
  CHECK(r.status == 404);
  CHECK(r.body == R"({"detail":"Not Found"})");
  CHECK(scrape_metrics(plain.ports()[0]).count(held_key) == 0);
}

TEST_CASE("mock pd: the transfer's time grows with the blocks pulled, before the first token", "[mock][pd]") {
  mock_engine prefill(1, {"--kv-role", "prefill"});
  mock_engine decode(1, {"--kv-role", "decode", "--kv-transfer-us-per-block", "100000"});
  const json client = {{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 1}};
  const auto answer = run_leg1(prefill, client, "slow");
  const auto start = steady::now();
  const auto r = send(decode.ports()[0], post("/v1/completions", leg2(client, answer), "slow"));
  REQUIRE(r.status == 200);
  // 3 blocks at 100 ms each: a lower bound only (a loaded machine may take longer, never less).
  CHECK(steady::now() - start >= std::chrono::milliseconds(300));
}
