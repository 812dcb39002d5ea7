// Prefill/decode disaggregation through the real dplb (--prefill, --decode): each leg's exact body and the one
// X-Request-Id (raw engines record what dplb sent), the mock engine's two roles end to end (the decode pulls
// the blocks the prefill holds; none is left held), a burst split exactly over the decode ranks, a prefill 4xx
// passed through, retries on either leg, aborts in either leg, and the metrics of both pools.

#include <catch2/catch.hpp>

#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../unit/kv/msgpack_writer.hpp"
#include "await.hpp"
#include "free_ports.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "raw_engine.hpp"
#include "temp_file.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// What a NixlConnector prefill instance answers: one token, and where the prompt's blocks wait.
const std::string prefill_params =
    R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[7,8,9],)"
    R"("remote_engine_id":"e-1","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1,"x-extra":{"k":[1,2.50]}})";

std::string json_response(unsigned status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + (status == 200 ? " OK" : " Bad Request") +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string prefill_answer() {
  return json_response(200, R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x"}],)"
                            R"("usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6},)"
                            R"("kv_transfer_params":)" + prefill_params + "}");
}

std::string decode_answer() {
  return json_response(200, R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"abc"}],)"
                            R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}})");
}

raw_engine prefill_engine() {
  return raw_engine([](const raw_request&) { return std::vector{write_bytes(prefill_answer())}; });
}
raw_engine decode_engine() {
  return raw_engine([](const raw_request&) { return std::vector{write_bytes(decode_answer())}; });
}

// No health checks: a raw engine answers every request as its script says, /health included, and each check
// would take a connection (and a place in the engine's request list) of its own.
std::vector<std::string> pd_args(const std::vector<std::string>& prefill, const std::vector<std::string>& decode,
                                 std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"--health-check-interval-ms", "0"};
  for (const auto& p : prefill) args.insert(args.end(), {"--prefill", p});
  for (const auto& d : decode) args.insert(args.end(), {"--decode", d});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

bhttp::request<bhttp::string_body> post(const std::string& target, const std::string& body,
                                        const std::string& request_id = "") {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, target, 11};
  r.set(bhttp::field::host, "x");
  r.set(bhttp::field::content_type, "application/json");
  if (!request_id.empty()) r.set("X-Request-Id", request_id);
  r.body() = body;
  r.prepare_payload();
  return r;
}

// 40 words: 3 blocks of the mock's synthetic tokens.
std::string long_prompt() {
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += (i == 0 ? "w" : " w") + std::to_string(i);
  return prompt;
}

double held_blocks(const mock_engine& mock) {
  double held = 0;
  for (std::size_t r = 0; r < mock.ports().size(); ++r) held += metric_sum(mock.metrics(r), "mock_kv_blocks_held");
  return held;
}

}  // namespace

TEST_CASE("pd: the prefill leg gets the rewritten body, the decode leg the client's plus kv_transfer_params verbatim, "
          "both one X-Request-Id",
          "[integration][pd]") {
  auto prefill = prefill_engine();
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}));
  const std::string client_body =
      R"({"model":"m","prompt":"hello","max_tokens":50,"max_completion_tokens":50,"stream":true,)"
      R"("stream_options":{"include_usage":true},"min_tokens":3,"temperature":0.5})";

  SECTION("a request without X-Request-Id gets one dplb made, the same on both legs") {
    http_connection client(proxy.port());
    const auto r = client.send(post("/v1/completions", client_body));
    CHECK(r.status == 200);
    CHECK(r.body == decode_answer().substr(decode_answer().find("\r\n\r\n") + 4));
    REQUIRE(prefill.await_requests(1, 5s));
    REQUIRE(decode.await_requests(1, 5s));
    const auto p = prefill.requests().at(0);
    const auto d = decode.requests().at(0);
    CHECK(p.target() == "/v1/completions");
    const auto leg1 = json::parse(p.body);
    CHECK(leg1["stream"] == false);
    CHECK(leg1["max_tokens"] == 1);
    CHECK(leg1["max_completion_tokens"] == 1);
    CHECK_FALSE(leg1.contains("stream_options"));
    CHECK_FALSE(leg1.contains("min_tokens"));
    CHECK(leg1["temperature"] == 0.5);
    CHECK(leg1["kv_transfer_params"] == json::parse(R"({"do_remote_decode":true,"do_remote_prefill":false,)"
                                                    R"("remote_engine_id":null,"remote_block_ids":null,)"
                                                    R"("remote_host":null,"remote_port":null})"));
    // The decode leg: the client's bytes, then the prefill's params byte for byte.
    CHECK(d.body == client_body.substr(0, client_body.size() - 1) + ",\"kv_transfer_params\":" + prefill_params + "}");
    const auto id = p.header("x-request-id");
    REQUIRE(id);
    CHECK(id->size() == 36);
    CHECK(d.header("x-request-id") == id);
    CHECK(p.header_values("x-request-id").size() == 1);
    CHECK(d.header_values("x-request-id").size() == 1);
  }
  SECTION("the client's X-Request-Id goes to both legs made unique, the same on both") {
    http_connection client(proxy.port());
    const auto r = client.send(post("/v1/chat/completions", R"({"model":"m","messages":[{"role":"user","content":"hi"}]})",
                                    "client-id-7"));
    CHECK(r.status == 200);
    REQUIRE(decode.await_requests(1, 5s));
    CHECK(prefill.requests().at(0).target() == "/v1/chat/completions");
    const auto ids = prefill.requests().at(0).header_values("x-request-id");
    REQUIRE(ids.size() == 1);
    CHECK(ids[0].starts_with("client-id-7-"));
    CHECK(decode.requests().at(0).header_values("x-request-id") == ids);
    CHECK_FALSE(json::parse(prefill.requests().at(0).body).contains("max_completion_tokens"));
  }
  SECTION("other paths go to a decode rank in one leg") {
    http_connection client(proxy.port());
    bhttp::request<bhttp::string_body> models{bhttp::verb::get, "/v1/models", 11};
    models.set(bhttp::field::host, "x");
    CHECK(client.send(models).status == 200);
    REQUIRE(decode.await_requests(1, 5s));
    CHECK(decode.requests().at(0).target() == "/v1/models");
    CHECK(prefill.request_count() == 0);
  }
}

TEST_CASE("pd: a body with its own kv_transfer_params is refused with 400 naming the field on every path (two legs, "
          "a pinned prefill or decode rank, another POST path), and no engine sees it",
          "[integration][pd]") {
  auto prefill = prefill_engine();
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}));
  http_connection client(proxy.port());
  const std::string pull_from_elsewhere =
      R"("kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e-x","remote_block_ids":[1,2],)"
      R"("remote_host":"10.9.9.9","remote_port":5600})";
  const auto refused = [&](bhttp::request<bhttp::string_body> r) {
    const auto answer = client.send(r);
    CHECK(answer.status == 400);
    CHECK(answer.keep_alive);
    const auto error = json::parse(answer.body)["error"];
    CHECK(error["param"] == "kv_transfer_params");
    CHECK(error["type"] == "BadRequestError");
    CHECK(error["code"] == 400);
    CHECK_THAT(error["message"].get<std::string>(), Catch::Contains("kv_transfer_params is set by dplb"));
  };
  refused(post("/v1/completions", R"({"model":"m","prompt":"p",)" + pull_from_elsewhere + "}"));
  refused(post("/v1/chat/completions",
               R"({"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_p\u0061rams":{"do_remote_decode":true}})"));
  for (const std::string rank : {"0", "1"}) {  // the prefill rank (one leg), the decode rank (two legs)
    auto pinned = post("/v1/completions", R"({"model":"m","prompt":"p",)" + pull_from_elsewhere + "}");
    pinned.set("X-data-parallel-rank", rank);
    refused(pinned);
  }
  refused(post("/tokenize", R"({"model":"m","prompt":"p",)" + pull_from_elsewhere + "}"));
  refused(post("/v1/embeddings", "{" + pull_from_elsewhere + R"(,"model":"m","input":"p"})"));
  CHECK(prefill.accepted_count() == 0);
  CHECK(decode.accepted_count() == 0);
  CHECK(metric_sum(scrape_metrics(proxy.port()), "dplb_rejected_requests_total{", {"code=\"400\""}) == 6);
  // A client's kv_transfer_params nested deeper, or named in a string, is its own business.
  CHECK(client.send(post("/v1/completions", R"({"model":"m","prompt":"kv_transfer_params","x":{"kv_transfer_params":1}})"))
            .status == 200);
  CHECK(prefill.request_count() == 1);
  CHECK(decode.request_count() == 1);
}

TEST_CASE("pd: a co-located cluster passes a client's kv_transfer_params on as it came", "[integration][pd]") {
  auto engine = decode_engine();
  dplb_proxy proxy({engine.url()}, {"--health-check-interval-ms", "0"});
  http_connection client(proxy.port());
  const std::string body = R"({"model":"m","prompt":"p","kv_transfer_params":{"do_remote_decode":true}})";
  CHECK(client.send(post("/v1/completions", body)).status == 200);
  REQUIRE(engine.await_requests(1, 5s));
  CHECK(engine.requests().at(0).body == body);
}

TEST_CASE("pd: two requests with one client X-Request-Id reach the engines under two ids, each the same on both "
          "legs, and each client gets its own id back",
          "[integration][pd]") {
  auto prefill = prefill_engine();
  // Echoes the X-Request-Id it got, as vLLM does with --enable-request-id-headers.
  raw_engine decode([](const raw_request& r) {
    auto answer = decode_answer();
    answer.insert(answer.find("\r\n") + 2, "X-Request-Id: " + r.header("x-request-id").value_or("none") + "\r\n");
    return std::vector{write_bytes(answer)};
  });
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}));
  for (int i = 0; i < 2; ++i) {
    http_connection client(proxy.port());
    const auto r = client.send(post("/v1/completions", R"({"model":"m","prompt":"p"})", "reused"));
    CHECK(r.status == 200);
    CHECK(r.headers.count("X-Request-Id") == 1);
    CHECK(r.headers["X-Request-Id"] == "reused");
  }
  REQUIRE(decode.await_requests(2, 5s));
  REQUIRE(prefill.await_requests(2, 5s));
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < 2; ++i) {
    const auto leg1 = prefill.requests().at(i).header_values("x-request-id");
    const auto leg2 = decode.requests().at(i).header_values("x-request-id");
    REQUIRE(leg1.size() == 1);
    CHECK(leg2 == leg1);
    CHECK(leg1[0].starts_with("reused-"));
    ids.push_back(leg1[0]);
  }
  CHECK(ids[0] != ids[1]);
}

TEST_CASE("pd: a 4xx from the prefill leg reaches the client as it came, and no decode leg runs", "[integration][pd]") {
  const std::string error = R"({"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400})";
  raw_engine prefill([&](const raw_request&) { return std::vector{write_bytes(json_response(400, error))}; });
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}));
  http_connection client(proxy.port());
  const auto r = client.send(post("/v1/completions", R"({"model":"m","prompt":"p","max_tokens":99999999})"));
  CHECK(r.status == 400);
  CHECK(r.body == error);
  CHECK(r.keep_alive);
  CHECK(decode.request_count() == 0);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_requests_total{", {"rank=\"0\"", "code=\"400\""}) == 1);
  CHECK(metric_sum(m, "dplb_requests_total{", {"rank=\"1\""}) == 0);
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
}

TEST_CASE("pd: a prefill rank that refuses is replaced by another, a decode rank that resets before answering too, "
          "with the same kv_transfer_params",
          "[integration][pd]") {
  const auto closed_port = free_port_range(1);  // nothing listens there: the connection is refused
  auto prefill = prefill_engine();
  raw_engine resetting([](const raw_request&) { return std::vector{reset_connection()}; });
  auto decode = decode_engine();
  // Round-robin on both pools: the refusing prefill rank and the resetting decode rank come first.
  dplb_proxy proxy({}, pd_args({"http://127.0.0.1:" + std::to_string(closed_port), prefill.url()},
                               {resetting.url(), decode.url()},
                               {"--policy", "round-robin", "--prefill-policy", "round-robin"}));
  http_connection client(proxy.port());
  const auto r = client.send(post("/v1/completions", R"({"model":"m","prompt":"p","max_tokens":3})"));
  CHECK(r.status == 200);
  REQUIRE(resetting.await_requests(1, 5s));
  REQUIRE(decode.await_requests(1, 5s));
  CHECK(resetting.requests().at(0).body == decode.requests().at(0).body);
  CHECK(json::parse(decode.requests().at(0).body)["kv_transfer_params"] == json::parse(prefill_params));
  CHECK(prefill.request_count() == 1);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_upstream_errors_total{", {"rank=\"0\"", "kind=\"connect\""}) == 1);
  CHECK(metric_sum(m, "dplb_upstream_errors_total{", {"rank=\"2\"", "kind=\"reset\""}) == 1);
  CHECK(metric_sum(m, "dplb_retries_total") == 2);
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
}

TEST_CASE("pd: a client that leaves during the prefill leg has that engine connection closed within 1 s, and no "
          "decode leg runs",
          "[integration][pd]") {
  raw_engine prefill([](const raw_request&) { return std::vector{pause_for(20s), write_bytes(prefill_answer())}; });
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}));
  http_connection client(proxy.port());
  const std::string body = R"({"model":"m","prompt":"p","max_tokens":3})";
  client.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  REQUIRE(prefill.await_requests(1, 5s));
  // The decode rank is not bound yet: it is picked when the prefill answers.
  const auto prefilling = scrape_metrics(proxy.port());
  CHECK(metric_sum(prefilling, "dplb_rank_inflight{", {"rank=\"0\""}) == 1);
  CHECK(metric_sum(prefilling, "dplb_rank_inflight{", {"rank=\"1\""}) == 0);
  const auto left_at = steady::now();
  client.close();
  REQUIRE(prefill.await_peer_close(0, 5s));
  CHECK(*prefill.peer_closed_at(0) - left_at < scaled(1s));
  const auto m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_inflight{") == 0; });
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
  CHECK(metric_sum(m, "dplb_requests_total{", {"rank=\"0\"", "code=\"499\""}) == 1);
  CHECK(decode.request_count() == 0);
}

TEST_CASE("pd: a client that leaves between the legs, waiting for a decode slot after its prefill answered, is "
          "counted as 499 among the rejected, and no decode leg runs",
          "[integration][pd]") {
  auto prefill = prefill_engine();
  raw_engine decode([](const raw_request&) { return std::vector{pause_for(20s), write_bytes(decode_answer())}; });
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}, {"--max-inflight-per-rank", "1", "--queue-timeout-ms", "20000"}));
  const auto send_raw = [&](http_connection& c, const std::string& body) {
    c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body);
  };
  http_connection first(proxy.port());
  send_raw(first, R"({"model":"m","prompt":"first"})");
  REQUIRE(decode.await_requests(1, 5s));  // the first holds the one decode slot for 20 s
  http_connection second(proxy.port());
  send_raw(second, R"({"model":"m","prompt":"second"})");
  REQUIRE(prefill.await_requests(2, 5s));
  // Its prefill answered, the second waits for the decode slot.
  const auto waiting = await_metrics(proxy.port(), [](const auto& m) {
    return metric_sum(m, "dplb_queue_depth") == 1 && metric_sum(m, "dplb_requests_total{", {"rank=\"0\"", "code=\"200\""}) == 2;
  });
  REQUIRE(metric_sum(waiting, "dplb_queue_depth") == 1);
  CHECK(metric_sum(waiting, "dplb_rejected_requests_total{", {"code=\"499\""}) == 0);
  second.close();
  const auto m = await_metrics(proxy.port(), [](const auto& m) {
    return metric_sum(m, "dplb_rejected_requests_total{", {"code=\"499\""}) == 1;
  });
  CHECK(metric_sum(m, "dplb_rejected_requests_total{", {"code=\"499\""}) == 1);
  CHECK(metric_sum(m, "dplb_queue_depth") == 0);
  CHECK(metric_sum(m, "dplb_requests_total{", {"rank=\"1\""}) == 0);  // the first is still decoding
  CHECK(decode.request_count() == 1);
}

TEST_CASE("pd: /metrics names every prefill and decode URL with its role, and the legs' histograms", "[integration][pd]") {
  auto prefill_a = prefill_engine();
  auto prefill_b = prefill_engine();
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill_a.url() + "," + prefill_b.url()}, {decode.url() + "#dp=2"}));
  http_connection client(proxy.port());
  CHECK(client.send(post("/v1/completions", R"({"model":"m","prompt":"p"})")).status == 200);
  const auto m = scrape_metrics(proxy.port());
  CHECK(m.count("dplb_rank_inflight{rank=\"0\",url=\"" + prefill_a.url() + "\"}") == 1);
  CHECK(m.count("dplb_rank_inflight{rank=\"1\",url=\"" + prefill_b.url() + "\"}") == 1);
  CHECK(m.count("dplb_rank_inflight{rank=\"2\",url=\"" + decode.url() + "\"}") == 1);
  CHECK(m.count("dplb_rank_inflight{rank=\"3\",url=\"" + decode.url() + "\"}") == 1);
  CHECK(m.count("dplb_rank_role{rank=\"0\",role=\"prefill\"}") == 1);
  CHECK(m.count("dplb_rank_role{rank=\"1\",role=\"prefill\"}") == 1);
  CHECK(m.count("dplb_rank_role{rank=\"3\",role=\"decode\"}") == 1);
  CHECK(metric_sum(m, "dplb_pd_leg_duration_seconds_count{", {"leg=\"prefill\""}) == 1);
  CHECK(metric_sum(m, "dplb_pd_leg_duration_seconds_count{", {"leg=\"decode\""}) == 1);
  CHECK(m.count("dplb_pd_prefill_skipped_total") == 1);
}

TEST_CASE("pd: the decode rank's time to first byte is the client's, prefill leg included", "[integration][pd]") {
  raw_engine prefill([](const raw_request&) { return std::vector{pause_for(300ms), write_bytes(prefill_answer())}; });
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}));
  http_connection client(proxy.port());
  CHECK(client.send(post("/v1/completions", R"({"model":"m","prompt":"p"})")).status == 200);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_time_to_first_byte_seconds_count{", {"rank=\"1\""}) == 1);
  CHECK(metric_sum(m, "dplb_time_to_first_byte_seconds_sum{", {"rank=\"1\""}) >= 0.3);
  CHECK(metric_sum(m, "dplb_pd_leg_duration_seconds_sum{", {"leg=\"prefill\""}) >= 0.3);
  CHECK(metric_sum(m, "dplb_pd_leg_duration_seconds_sum{", {"leg=\"decode\""}) < 0.3);
}

TEST_CASE("pd: the mock's two roles end to end: streams and not, chat and completions, no block left held",
          "[integration][pd]") {
  mock_engine prefill(2, {"--kv-role", "prefill"});
  mock_engine decode(2, {"--kv-role", "decode"});
  dplb_proxy proxy({}, pd_args(prefill.urls(), decode.urls()));
  http_connection client(proxy.port());
  for (const bool stream : {false, true}) {
    const auto r = client.send_streaming(post(
        "/v1/completions", json{{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 4}, {"stream", stream}}.dump()));
    CHECK(r.status == 200);
    CHECK(r.body.find(stream ? "data: [DONE]" : "\"usage\"") != std::string::npos);
    const auto chat = client.send(post(
        "/v1/chat/completions",
        json{{"model", "mock-model"}, {"messages", {{{"role", "user"}, {"content", long_prompt()}}}}, {"max_tokens", 4},
             {"stream", stream}}.dump()));
    CHECK(chat.status == 200);
  }
  double transfers = 0;
  for (std::size_t r = 0; r < decode.ports().size(); ++r) transfers += metric_sum(decode.metrics(r), "mock_kv_transfers_total");
  CHECK(transfers == 4);
  CHECK(held_blocks(prefill) == 0);
}

TEST_CASE("pd: a burst lands exactly even on the decode ranks", "[integration][pd]") {
  mock_engine prefill(2, {"--kv-role", "prefill"});
  // Every decode leg takes two seconds: the whole burst is in flight at once, each pick sees all before it.
  mock_engine decode(4, {"--kv-role", "decode", "--itl-ms", "100"});
  dplb_proxy proxy({}, pd_args(prefill.urls(), decode.urls(), {"--threads", "2"}));
  constexpr int burst = 64;
  std::vector<std::future<unsigned>> answers;
  for (int i = 0; i < burst; ++i) {
    answers.push_back(std::async(std::launch::async, [&proxy, i] {
      http_connection client(proxy.port());
      return client.send(post("/v1/completions", json{{"model", "mock-model"}, {"prompt", "p" + std::to_string(i)},
                                                      {"max_tokens", 20}}.dump())).status;
    }));
  }
  for (auto& a : answers) CHECK(a.get() == 200);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_retries_total") == 0);
  CHECK(metric_sum(m, "dplb_upstream_errors_total{") == 0);
  for (int rank = 2; rank < 6; ++rank) {
    CHECK(metric_sum(m, "dplb_requests_total{", {"rank=\"" + std::to_string(rank) + "\"", "code=\"200\""}) == burst / 4);
  }
  CHECK(metric_sum(m, "dplb_requests_total{", {"rank=\"0\""}) + metric_sum(m, "dplb_requests_total{", {"rank=\"1\""}) == burst);
  CHECK(held_blocks(prefill) == 0);
}

TEST_CASE("pd: a client that leaves during the decode leg aborts it, and no block stays held", "[integration][pd]") {
  mock_engine prefill(1, {"--kv-role", "prefill"});
  mock_engine decode(1, {"--kv-role", "decode", "--itl-ms", "200"});
  dplb_proxy proxy({}, pd_args(prefill.urls(), decode.urls()));
  http_connection client(proxy.port());
  const auto body = json{{"model", "mock-model"}, {"prompt", long_prompt()}, {"max_tokens", 200}, {"stream", true}}.dump();
  client.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  // The decode leg is streaming once the decode engine has pulled the blocks.
  await_until([&] { return metric_sum(decode.metrics(0), "mock_kv_transfers_total"); }, [](double n) { return n == 1; });
  client.close();
  const auto m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_inflight{") == 0; });
  CHECK(metric_sum(m, "dplb_requests_total{", {"rank=\"1\"", "code=\"499\""}) == 1);
  CHECK(held_blocks(prefill) == 0);
  CHECK(metric_sum(decode.metrics(0), "mock_kv_transfers_total") == 1);
}

namespace {

// `blocks` blocks of 16 token ids: first, first + 1, ...
std::vector<std::uint32_t> token_ids(int blocks, std::uint32_t first) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(blocks * 16));
  std::iota(out.begin(), out.end(), first);
  return out;
}

std::string stored_batch(const std::vector<std::uint32_t>& tokens) {
  dplb::kv::test::msgpack_writer w;
  const auto blocks = tokens.size() / 16;
  w.map(2).str("ts").float64(1.0e9).str("events").array(1).map(8);
  w.str("type").str("BlockStored").str("block_hashes").array(static_cast<std::uint32_t>(blocks));
  for (std::size_t b = 0; b < blocks; ++b) w.uint(9000 + b);
  w.str("parent_block_hash").nil().str("token_ids").uints(tokens).str("block_size").uint(16);
  w.str("lora_id").nil().str("medium").str("GPU").str("lora_name").nil();
  const auto bytes = w.bytes();
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

TEST_CASE("pd: a prompt the decode rank's KV-cache events say it holds skips the prefill leg "
          "(--pd-skip-prefill-ratio), one it holds less of does not",
          "[integration][pd]") {
  // The mock only publishes the events (its admin's /kv-events/publish); raw engines serve both pools.
  const auto events_port = free_port_range(1);
  mock_engine publisher(1, {"--simulate", "--time-scale", "100", "--kv-events-port", std::to_string(events_port)});
  auto prefill = prefill_engine();
  auto holder = decode_engine();
  auto other = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()},
                               {holder.url() + "#kv-events=tcp://127.0.0.1:" + std::to_string(events_port), other.url()},
                               {"--policy", "prefix-aware", "--pd-skip-prefill-ratio", "0.8"}));
  const auto publish = [&](const std::string& payload) {
    REQUIRE(http_post_json(publisher.admin_port(), "/kv-events/publish?rank=0&engine=0", payload).status == 200);
  };
  // ZMQ's slow joiner: published batches count only once dplb's subscription has reached the publisher.
  const auto blocks = [&] { return metric_sum(scrape_metrics(proxy.port()), "dplb_kv_blocks{", {"rank=\"1\""}); };
  const auto hot = token_ids(8, 500'000);
  for (int attempt = 0; attempt < 100 && blocks() < 8; ++attempt) {
    publish(stored_batch(hot));
    await_until(blocks, [](double b) { return b >= 8; }, 100ms);
  }
  REQUIRE(blocks() >= 8);

  auto prompt = hot;
  const auto tail = token_ids(1, 600'000);
  prompt.insert(prompt.end(), tail.begin(), tail.end());  // 8 of its 9 blocks held: 0.89
  const std::string held_body = json{{"model", "m"}, {"prompt", prompt}, {"max_tokens", 3}}.dump();
  http_connection client(proxy.port());
  CHECK(client.send(post("/v1/completions", held_body)).status == 200);
  REQUIRE(holder.await_requests(1, 5s));
  CHECK(holder.requests().at(0).body == held_body);  // one leg: the client's body as it came
  CHECK(prefill.request_count() == 0);

  auto half = token_ids(4, 500'000);
  const auto rest = token_ids(6, 700'000);
  half.insert(half.end(), rest.begin(), rest.end());  // 4 of 10: 0.4
  CHECK(client.send(post("/v1/completions", json{{"model", "m"}, {"prompt", half}, {"max_tokens", 3}}.dump())).status == 200);
  REQUIRE(prefill.await_requests(1, 5s));
  // The held prompt again, with a kv_transfer_params of the client's: refused, where it would skip the prefill.
  const auto decode_legs = holder.request_count() + other.request_count();
  auto own_params = json{{"model", "m"}, {"prompt", prompt}, {"max_tokens", 3}};
  own_params["kv_transfer_params"] = {{"do_remote_prefill", true}, {"remote_host", "10.9.9.9"}};
  const auto refused = client.send(post("/v1/completions", own_params.dump()));
  CHECK(refused.status == 400);
  CHECK(json::parse(refused.body)["error"]["param"] == "kv_transfer_params");
  CHECK(holder.request_count() + other.request_count() == decode_legs);
  CHECK(prefill.request_count() == 1);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_pd_prefill_skipped_total") == 1);
  CHECK(metric_sum(m, "dplb_pd_leg_duration_seconds_count{", {"leg=\"prefill\""}) == 1);
}

TEST_CASE("pd: the admin API shows each rank's role, and a backend added with a role joins that pool",
          "[integration][pd]") {
  const std::string token = "pd-admin-token";
  const temp_file token_file(token + "\n");
  auto prefill = prefill_engine();
  auto decode = decode_engine();
  auto second_prefill = prefill_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()},
                               {"--admin-listen", "127.0.0.1:0", "--admin-token-file", token_file.path()}));
  const auto admin = [&](bhttp::verb method, const std::string& target, const std::string& body = {}) {
    http_connection c(proxy.admin_port());
    bhttp::request<bhttp::string_body> r{method, target, 11};
    r.set(bhttp::field::authorization, "Bearer " + token);
    if (!body.empty()) {
      r.set(bhttp::field::content_type, "application/json");
      r.body() = body;
    }
    return c.send(r);
  };
  const auto ranks = json::parse(admin(bhttp::verb::get, "/ranks").body);
  REQUIRE(ranks["ranks"].size() == 2);
  CHECK(ranks["ranks"][0]["role"] == "prefill");
  CHECK(ranks["ranks"][1]["role"] == "decode");
  CHECK(ranks["ranks"][0]["cluster"] == "default");

  const auto added = admin(bhttp::verb::post, "/backends", json{{"url", second_prefill.url()}, {"role", "prefill"}}.dump());
  REQUIRE(added.status == 201);
  CHECK(json::parse(added.body)["ranks"][0]["role"] == "prefill");
  CHECK(admin(bhttp::verb::post, "/backends", json{{"url", "http://127.0.0.1:9"}, {"role", "cook"}}.dump()).status == 400);
  // Two requests: least-inflight takes the prefill ranks in turn, so the new one serves a prefill leg.
  http_connection client(proxy.port());
  for (int i = 0; i < 2; ++i) CHECK(client.send(post("/v1/completions", R"({"model":"m","prompt":"p"})")).status == 200);
  CHECK(second_prefill.request_count() == 1);
  CHECK(decode.request_count() == 2);
  CHECK(scrape_metrics(proxy.port()).count("dplb_rank_role{rank=\"2\",role=\"prefill\"}") == 1);
}

TEST_CASE("pd: a prefill engine that answers 200 without kv_transfer_params gets the client a 502 that says what to "
          "fix, and a body that is no JSON object a 400, with no leg sent",
          "[integration][pd]") {
  raw_engine prefill([](const raw_request&) { return std::vector{write_bytes(decode_answer())}; });
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}));
  http_connection client(proxy.port());
  const auto r = client.send(post("/v1/completions", R"({"model":"m","prompt":"p"})"));
  CHECK(r.status == 502);
  CHECK_THAT(r.body, Catch::Contains("without kv_transfer_params") && Catch::Contains("--kv-transfer-config"));
  CHECK(json::parse(r.body)["error"]["code"] == 502);
  CHECK(decode.request_count() == 0);
  // A byte order mark before the object: JSON parsers differ on it, and the decode leg's body could not be written.
  const auto bom = client.send(post("/v1/completions", "\xEF\xBB\xBF" R"({"model":"m","prompt":"p"})"));
  CHECK(bom.status == 400);
  CHECK(client.send(post("/v1/completions", R"(["not", "an", "object"])")).status == 400);
  CHECK(prefill.request_count() == 1);
  CHECK(decode.request_count() == 0);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
}

TEST_CASE("pd: under --max-inflight-per-rank a request waits for a prefill slot, and leaving during its prefill leg "
          "after that wait still closes the leg",
          "[integration][pd]") {
  // The first request holds the one prefill slot for 20 s; the second waits in the prefill queue for it.
  raw_engine prefill([](const raw_request&) { return std::vector{pause_for(20s), write_bytes(prefill_answer())}; });
  auto decode_a = decode_engine();
  auto decode_b = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode_a.url(), decode_b.url()},
                               {"--max-inflight-per-rank", "1", "--queue-timeout-ms", "20000"}));
  const auto send_raw = [&](http_connection& c, const std::string& body) {
    c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body);
  };
  http_connection first(proxy.port());
  send_raw(first, R"({"model":"m","prompt":"first"})");
  REQUIRE(prefill.await_requests(1, 5s));
  http_connection second(proxy.port());
  send_raw(second, R"({"model":"m","prompt":"second"})");
  // Queued for the prefill slot, holding no decode slot (nor does the first, in its prefill leg): a decode slot
  // is taken when the prefill answers.
  const auto queued = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_queue_depth") == 1; });
  REQUIRE(metric_sum(queued, "dplb_queue_depth") == 1);
  CHECK(metric_sum(queued, "dplb_rank_inflight{", {"rank=\"1\""}) + metric_sum(queued, "dplb_rank_inflight{", {"rank=\"2\""}) == 0);
  first.close();  // frees the prefill slot: the second request's prefill leg starts
  REQUIRE(prefill.await_requests(2, 5s));
  const auto left_at = steady::now();
  second.close();
  const auto second_connection = prefill.requests().at(1).connection;
  REQUIRE(prefill.await_peer_close(second_connection, 5s));
  CHECK(*prefill.peer_closed_at(second_connection) - left_at < scaled(1s));
  const auto m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_inflight{") == 0; });
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
  CHECK(decode_a.request_count() + decode_b.request_count() == 0);
}

TEST_CASE("pd: under --max-inflight-per-rank a prefill retry whose other prefill ranks are full waits for a slot",
          "[integration][pd][retry]") {
  // Prefill rank 0 resets every request before answering; prefill rank 1 holds the first request it gets for
  // 2 s. The first request is reset on rank 0 and retried on rank 1; the second is reset on rank 0 too, finds
  // rank 1 full, and waits in the prefill queue for its slot (before retries could wait: a 502).
  raw_engine resetting([](const raw_request&) { return std::vector{reset_connection()}; });
  std::atomic<int> prefills{0};
  raw_engine prefill([&](const raw_request&) {
    if (prefills++ == 0) return std::vector{pause_for(2s), write_bytes(prefill_answer())};
    return std::vector{write_bytes(prefill_answer())};
  });
  auto decode_a = decode_engine();
  auto decode_b = decode_engine();
  dplb_proxy proxy({}, pd_args({resetting.url(), prefill.url()}, {decode_a.url(), decode_b.url()},
                               {"--max-inflight-per-rank", "1", "--queue-timeout-ms", "20000", "--prefill-policy",
                                "round-robin", "--ejection-threshold", "0"}));
  http_response first;
  std::thread first_client([&] {
    http_connection c(proxy.port());
    first = c.send(post("/v1/completions", R"({"model":"m","prompt":"first","max_tokens":3})"));
  });
  REQUIRE(prefill.await_requests(1, 5s));
  http_response second;
  std::thread second_client([&] {
    http_connection c(proxy.port());
    second = c.send(post("/v1/completions", R"({"model":"m","prompt":"second","max_tokens":3})"));
  });
  const auto queued = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_queue_depth") == 1; });
  CHECK(metric_sum(queued, "dplb_queue_depth") == 1);  // the second, reset on rank 0, waiting for rank 1
  first_client.join();
  second_client.join();
  CHECK(first.status == 200);
  CHECK(second.status == 200);
  CHECK(prefill.request_count() == 2);
  CHECK(resetting.request_count() == 2);
  CHECK(decode_a.request_count() + decode_b.request_count() == 2);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_retries_total") == 2);
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
  CHECK(metric_sum(m, "dplb_queue_depth") == 0);
}

TEST_CASE("pd: the access log has one line per two-leg request: the decode leg's rank and times, the prefill leg's, "
          "and the request id",
          "[integration][pd]") {
  const temp_file log_file;  // dplb appends to it
  auto prefill = prefill_engine();
  auto decode = decode_engine();
  dplb_proxy proxy({}, pd_args({prefill.url()}, {decode.url()}, {"--access-log", log_file.path()}));
  http_connection client(proxy.port());
  CHECK(client.send(post("/v1/completions", R"({"model":"m","prompt":"p"})", "log-id-1")).status == 200);
  const auto lines = await_until(
      [&] {
        std::ifstream in(log_file.path());
        std::vector<json> out;
        for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
        return out;
      },
      [](const auto& l) { return l.size() == 1; });
  REQUIRE(lines.size() == 1);
  const auto& line = lines[0];
  CHECK(line["rank"] == 1);
  CHECK(line["status"] == 200);
  CHECK(line["client_request_id"] == "log-id-1");
  CHECK(line["request_id"].get<std::string>().starts_with("log-id-1-"));
  CHECK(line["prefill_rank"] == 0);
  CHECK(line["prefill_status"] == 200);
  CHECK(line["prefill_duration"].is_number());
  CHECK(line["ttfb"].get<double>() >= line["prefill_duration"].get<double>());
  CHECK(line["completion_tokens"] == 3);  // the decode leg's usage, not the prefill's one token
}
