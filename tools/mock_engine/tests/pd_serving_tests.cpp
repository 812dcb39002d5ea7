// Prefill/decode roles end to end: one prefill mock process and one decode mock process, run in two legs
// as vLLM's disaggregated router does. Waits are on /metrics (await_metrics), never on time.

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

namespace {

const std::string steps_key = "mock_steps_total{engine=\"0\"}";
const std::string step_seconds_key = "mock_step_seconds_total{engine=\"0\"}";
const std::string padded_key = "mock_padded_tokens_total{engine=\"0\"}";
const std::string real_key = "mock_real_tokens_total{engine=\"0\"}";
const std::string routed_key = "mock_requests_routed_total{engine=\"0\"}";
const std::string aborted_key = "mock_requests_aborted_total{engine=\"0\"}";

// Simulated engines whose steps cost 15 ms + 0.15 ms per padded sequence + 1 ms per prompt token
// prefilled, 20 times faster than the wall.
std::vector<std::string> simulated(const char* role, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"--kv-role", role, "--simulate", "--time-scale", "20", "--prefill-us-per-token",
                                   "1000"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// vllm:kv_cache_usage_perc of the port's engines, summed: the share of their KV blocks in use.
double kv_usage(const std::map<std::string, double>& metrics) {
  double sum = 0;
  for (const auto& [key, value] : metrics) {
    if (key.rfind("vllm:kv_cache_usage_perc{", 0) == 0) sum += value;
  }
  return sum;
}

// Leg 2 on a connection of its own, left open: the caller closes it (the client goes away).
// `engine`: sent as X-data-parallel-rank, unless negative.
std::unique_ptr<http_connection> start_leg2(const mock_engine& decode, const json& client, const json& answer,
                                            int engine = -1) {
  auto connection = std::make_unique<http_connection>(decode.ports()[0]);
  auto req = post("/v1/completions", leg2(client, answer), "gone");
  req.set(bhttp::field::host, "127.0.0.1");
  if (engine >= 0) req.set("X-data-parallel-rank", std::to_string(engine));
  req.prepare_payload();
  std::ostringstream raw;
  raw << req;
  connection->write_raw(raw.str());
  return connection;
}

}  // namespace

TEST_CASE("mock pd: with --simulate a prefill pays its prompt's prefill, a decode joins the batch without it",
          "[mock][pd][sim]") {
  mock_engine prefill(1, simulated("prefill", {"--kv-blocks", "100"}));
  mock_engine decode(1, simulated("decode", {"--kv-transfer-us-per-block", "100"}));
  const json client = {{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 3}, {"stream", true}};

  const auto answer = run_leg1(prefill, client, "sim-1");
  CHECK(answer["usage"]["completion_tokens"] == 1);
  CHECK(answer["kv_transfer_params"]["remote_block_ids"].size() == 3);  // 40 tokens, --block-size 16
  const auto p = scrape_metrics(prefill.ports()[0]);
  CHECK(p.at(held_key) == 3);
  CHECK(kv_usage(p) == Approx(0.03));  // the held blocks stay allocated in the prefill engine's cache
  // One step: 15 ms + 0.15 ms (a batch of 1) + 40 prompt tokens x 1 ms.
  CHECK(p.at(steps_key) == 1);
  CHECK(p.at(step_seconds_key) == Approx(0.05515).margin(1e-9));

  http_connection connection(decode.ports()[0]);
  const auto r = connection.send_streaming(post("/v1/completions", leg2(client, answer), "sim-1"));
  REQUIRE(r.status == 200);
  CHECK(r.body.find("data: [DONE]") != std::string::npos);
  const auto d = scrape_metrics(decode.ports()[0]);
  CHECK(d.at(transfers_key) == 1);
  // Three steps of one sequence; only the last prompt token is computed (1 ms), not the 40 pulled.
  CHECK(d.at(steps_key) == 3);
  CHECK(d.at(step_seconds_key) == Approx(3 * 0.01515 + 0.001).margin(1e-9));
  CHECK(d.at(padded_key) == 3);
  CHECK(d.at(real_key) == 3);
  CHECK(await_metrics(prefill.ports()[0], [](const auto& m) { return m.at(held_key) == 0; }).at(held_key) == 0);
  CHECK(kv_usage(await_metrics(prefill.ports()[0], [](const auto& m) { return kv_usage(m) == 0; })) == 0);

  // Without kv_transfer_params the decode engine prefills the prompt itself (co-located fallback); 40
  // other words, so that its prefix cache (which keeps the pulled prompt's blocks) has none of them.
  auto plain = client;
  plain["stream"] = false;
  std::string other;
  for (int i = 0; i < 40; ++i) other += (i == 0 ? "u" : " u") + std::to_string(i);
  plain["prompt"] = other;
  const auto whole = send(decode.ports()[0], post("/v1/completions", plain, ""));
  REQUIRE(whole.status == 200);
  const auto after = scrape_metrics(decode.ports()[0]);
  CHECK(after.at(steps_key) == 6);
  CHECK(after.at(step_seconds_key) == Approx(6 * 0.01515 + 0.001 + 0.040).margin(1e-9));
}

TEST_CASE("mock pd: with --simulate --dp-lockstep pulled requests share the decode steps, padded = real",
          "[mock][pd][sim]") {
  mock_engine prefill(1, simulated("prefill", {"--dp", "4"}));
  mock_engine decode(1, simulated("decode", {"--dp", "4", "--dp-lockstep", "--start-after", "8"}));
  const json client = {{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 4}};
  std::vector<json> answers;
  for (int i = 0; i < 8; ++i) answers.push_back(run_leg1(prefill, client, "burst-" + std::to_string(i)));
  // 8 decode legs at once, 2 per engine (named by the header); the engines start when all are in.
  std::vector<std::unique_ptr<http_connection>> legs;
  for (std::size_t i = 0; i < answers.size(); ++i)
    legs.push_back(start_leg2(decode, client, answers[i], static_cast<int>(i % 4)));
  for (auto& leg : legs) {
    const auto reply = leg->read_responses(1, std::chrono::seconds(10));
    REQUIRE(reply.final_responses().size() == 1);
    CHECK(reply.final_responses()[0].status == 200);
  }
  const auto d = scrape_metrics(decode.ports()[0]);
  double padded = 0;
  double real = 0;
  for (int e = 0; e < 4; ++e) {
    const auto engine = "{engine=\"" + std::to_string(e) + "\"}";
    CHECK(d.at("mock_kv_transfers_total" + engine) == 2);
    CHECK(d.at("mock_steps_total" + engine) == 4);  // every engine, in lockstep: 4 tokens, no prefill step
    padded += d.at("mock_padded_tokens_total" + engine);
    real += d.at("mock_real_tokens_total" + engine);
  }
  CHECK(real == 8 * 4);
  CHECK(padded == real);  // 2 a rank is a capture size: nothing padded
  CHECK(await_metrics(prefill.ports()[0], [](const auto& m) {
          double held = 0;
          for (int e = 0; e < 4; ++e) held += m.at("mock_kv_blocks_held{engine=\"" + std::to_string(e) + "\"}");
          return held == 0;
        }).at(held_key) == 0);
}

TEST_CASE("mock pd: with --simulate an expired hold frees the prefill engine's blocks", "[mock][pd][sim]") {
  mock_engine prefill(1, simulated("prefill", {"--kv-blocks", "100", "--kv-hold-timeout-ms", "200"}));
  const json client = {{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 2}};
  run_leg1(prefill, client, "expiring");
  CHECK(kv_usage(scrape_metrics(prefill.ports()[0])) == Approx(0.03));
  const auto m = await_metrics(prefill.ports()[0], [](const auto& m) { return kv_usage(m) == 0; });
  CHECK(kv_usage(m) == 0);
  CHECK(m.at(expired_key) == 1);
  CHECK(m.at(held_key) == 0);
}

TEST_CASE("mock pd: a decode that fails or is abandoned leaves no block held on the prefill", "[mock][pd]") {
  const bool simulate = GENERATE(false, true);
  INFO("simulate " << simulate);
  // Without --simulate, 5 ms between tokens: an unread stream of 100,000 tokens never ends during the test.
  const auto args = [&](const char* role) {
    return simulate ? simulated(role) : std::vector<std::string>{"--kv-role", role, "--itl-ms", "5"};
  };
  mock_engine prefill(1, args("prefill"));
  mock_engine decode(1, args("decode"));
  const json client = {{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 100000}, {"stream", true}};
  const auto held_zero = [&] {
    return await_metrics(prefill.ports()[0], [](const auto& m) { return m.at(held_key) == 0; });
  };

  SECTION("an injected status: no pull, the hold is freed at once") {
    const auto answer = run_leg1(prefill, client, "fault");
    CHECK(scrape_metrics(prefill.ports()[0]).at(held_key) == 3);
    decode.set_fault(0, R"({"status": 503})");
    const auto r = send(decode.ports()[0], post("/v1/completions", leg2(client, answer), "fault"));
    CHECK(r.status == 503);
    const auto m = held_zero();
    CHECK(m.at(held_key) == 0);
    CHECK(m.at(expired_key) == 0);
    CHECK(scrape_metrics(decode.ports()[0]).at(transfers_key) == 0);  // a release is not a transfer
  }

  SECTION("a client gone while the decode stalls before its pull") {
    const auto answer = run_leg1(prefill, client, "stalled");
    decode.set_fault(0, R"({"stall_ms": 60000})");
    auto leg = start_leg2(decode, client, answer);
    await_metrics(decode.ports()[0], [](const auto& m) { return m.at(routed_key) == 1; });
    CHECK(scrape_metrics(prefill.ports()[0]).at(held_key) == 3);
    leg->close();
    const auto m = held_zero();
    CHECK(m.at(held_key) == 0);
    CHECK(m.at(expired_key) == 0);
    CHECK(await_metrics(decode.ports()[0], [](const auto& m) { return m.at(aborted_key) == 1; }).at(aborted_key) == 1);
  }

  SECTION("a client gone mid-stream, after the pull") {
    const auto answer = run_leg1(prefill, client, "midway");
    auto leg = start_leg2(decode, client, answer);
    await_metrics(decode.ports()[0], [](const auto& m) { return m.at(transfers_key) == 1; });
    leg->close();
    CHECK(held_zero().at(held_key) == 0);
    const auto d =
        await_metrics(decode.ports()[0], [](const auto& m) { return m.at(aborted_key) == 1; });
    CHECK(d.at(aborted_key) == 1);
    if (simulate) {
      CHECK(await_metrics(decode.ports()[0], [](const auto& m) {
              return m.at("mock_decode_tokens_pending{engine=\"0\"}") == 0;
            }).at("mock_decode_tokens_pending{engine=\"0\"}") == 0);
    }
  }

  SECTION("many abandoned legs, before and after their pulls") {
    std::vector<std::unique_ptr<http_connection>> legs;
    for (int i = 0; i < 8; ++i) legs.push_back(start_leg2(decode, client, run_leg1(prefill, client, "many")));
    await_metrics(decode.ports()[0], [](const auto& m) { return m.at(transfers_key) == 8; });
    decode.set_fault(0, R"({"stall_ms": 60000})");
    for (int i = 0; i < 8; ++i) legs.push_back(start_leg2(decode, client, run_leg1(prefill, client, "many")));
    await_metrics(decode.ports()[0], [](const auto& m) { return m.at(routed_key) == 16; });
    for (auto& leg : legs) leg->close();
    const auto m = held_zero();
    CHECK(m.at(held_key) == 0);
    CHECK(m.at(expired_key) == 0);
    CHECK(await_metrics(decode.ports()[0], [](const auto& m) { return m.at(aborted_key) == 16; }).at(aborted_key) == 16);
  }
}
