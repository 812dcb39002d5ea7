// DP engines behind one port, end to end: the real mock on loopback ports (--dp N), driven over HTTP.
// X-data-parallel-rank routing and its 400, the port's own balancing, the per-engine /metrics and the
// admin port's overrides, raw text and /stats. Waits are on observable state (/stats), never on time.

#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using json = nlohmann::json;

namespace {

std::string running_key(unsigned engine) {
  return "vllm:num_requests_running{engine=\"" + std::to_string(engine) + "\",model_name=\"mock-model\"}";
}

bhttp::request<bhttp::string_body> completion(std::optional<std::string> dp_rank, bool stream = false,
                                              unsigned max_tokens = 1) {
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
  req.set(bhttp::field::content_type, "application/json");
  if (dp_rank) req.set("X-data-parallel-rank", *dp_rank);
  req.body() = json{{"model", "mock-model"}, {"prompt", "a b c"}, {"max_tokens", max_tokens}, {"stream", stream}}.dump();
  return req;
}

http_response send(std::uint16_t port, bhttp::request<bhttp::string_body> req) {
  http_connection connection(port);
  return connection.send(std::move(req));
}

std::string engine_of(const http_response& r) { return std::string(r.headers["x-mock-engine"]); }

json stats(const mock_engine& mock) {
  const auto r = http_get(mock.admin_port(), "/stats");
  REQUIRE(r.status == 200);
  return json::parse(r.body);
}

std::uint64_t routed(const json& s, unsigned rank, unsigned engine, const char* field = "requests_routed") {
  return s["ports"][rank]["engines"][engine][field].get<std::uint64_t>();
}

// The admin call's status; the body must be JSON.
unsigned admin(const mock_engine& mock, bhttp::verb method, const std::string& target, const std::string& body = {}) {
  http_connection connection(mock.admin_port());
  bhttp::request<bhttp::string_body> req{method, target, 11};
  req.body() = body;
  return connection.send(std::move(req)).status;
}

// `words` distinct words that all begin with `stem`: prompts of different stems share no KV block.
std::string prompt_of(const std::string& stem, unsigned words) {
  std::string prompt;
  for (unsigned i = 0; i < words; ++i) prompt += (i == 0 ? "" : " ") + stem + std::to_string(i);
  return prompt;
}

std::string completion_body(const std::string& prompt) {
  return json{{"model", "mock-model"}, {"prompt", prompt}, {"max_tokens", 1}}.dump();
}

bhttp::request<bhttp::string_body> completion_of(const std::string& prompt, std::optional<std::string> dp_rank) {
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
  req.set(bhttp::field::content_type, "application/json");
  if (dp_rank) req.set("X-data-parallel-rank", *dp_rank);
  req.body() = completion_body(prompt);
  return req;
}

// The same request as raw bytes, for a connection that only sends (its answer is not awaited).
std::string raw_completion_of(const std::string& prompt) {
  const auto body = completion_body(prompt);
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

TEST_CASE("mock dp: X-data-parallel-rank picks the engine of the port, echo and /stats say which",
          "[mock][dp]") {
  mock_engine mock(2, {"--dp", "3"});
  for (unsigned j : {2U, 0U, 1U, 2U}) {
    const auto r = send(mock.ports()[0], completion(std::to_string(j)));
    REQUIRE(r.status == 200);
    CHECK(engine_of(r) == std::to_string(j));
    CHECK(r.headers["x-mock-rank"] == "0");
  }
  const auto s = stats(mock);
  CHECK(routed(s, 0, 0) == 1);
  CHECK(routed(s, 0, 1) == 1);
  CHECK(routed(s, 0, 2) == 2);
  CHECK(routed(s, 0, 2, "requests_routed_by_header") == 2);
  CHECK(routed(s, 1, 2) == 0);
  REQUIRE(s["ports"][0]["recent"].size() == 4);
  CHECK(s["ports"][0]["recent"][0] == json{{"engine", 2}, {"x_data_parallel_rank", "2"}});
  CHECK(s["ports"][0]["port"] == mock.ports()[0]);

  http_connection echo(mock.ports()[1]);
  bhttp::request<bhttp::string_body> req{bhttp::verb::get, "/mock/echo", 11};
  req.set("x-DATA-parallel-RANK", "1");  // the name is case-insensitive
  const auto e = echo.send(std::move(req));
  REQUIRE(e.status == 200);
  const auto report = json::parse(e.body);
  CHECK(report["engine"] == 1);
  CHECK(report["x_data_parallel_rank"] == "1");
}

TEST_CASE("mock dp: a rank the port does not serve gets vLLM's 400 before any work, streams too",
          "[mock][dp]") {
  mock_engine mock(1, {"--dp", "2"});
  for (const char* value : {"2", "-1", "1000000000000"}) {
    for (const bool stream : {false, true}) {
      INFO(value << (stream ? " streaming" : ""));
      const auto r = send(mock.ports()[0], completion(value, stream));
      CHECK(r.status == 400);
      CHECK(r.headers[bhttp::field::content_type] == "application/json");
      CHECK(r.headers[bhttp::field::transfer_encoding].empty());  // a plain answer, no event stream
      const auto body = json::parse(r.body);
      CHECK(body["error"]["type"] == "BadRequestError");
      CHECK(body["error"]["code"] == 400);
      CHECK(body["error"]["param"].is_null());
      CHECK(body["error"]["message"].get<std::string>().find(value) != std::string::npos);
    }
  }
  const auto s = stats(mock);
  CHECK(routed(s, 0, 0) == 0);
  CHECK(routed(s, 0, 1) == 0);
  CHECK(s["ports"][0]["recent"][0] == json{{"engine", nullptr}, {"x_data_parallel_rank", "2"}});
  const auto m = scrape_metrics(mock.ports()[0]);
  CHECK(m.at("vllm:prompt_tokens_total{engine=\"0\",model_name=\"mock-model\"}") == 0);
  CHECK(m.at("vllm:prompt_tokens_total{engine=\"1\",model_name=\"mock-model\"}") == 0);
}

TEST_CASE("mock dp: a value that is not an integer is ignored", "[mock][dp]") {
  mock_engine mock(1, {"--dp", "2"});
  for (const char* value : {"one", "1.0", ""}) {
    INFO(value);
    const auto r = send(mock.ports()[0], completion(value));
    CHECK(r.status == 200);
    CHECK(engine_of(r) == "0");  // the port's choice: nothing in flight, the lowest index
  }
  const auto s = stats(mock);
  CHECK(routed(s, 0, 0) == 3);
  CHECK(routed(s, 0, 0, "requests_routed_by_header") == 0);
  CHECK(s["ports"][0]["recent"][0] == json{{"engine", 0}, {"x_data_parallel_rank", "one"}});
}

TEST_CASE("mock dp: without the header the port picks the engine with the fewest requests in flight",
          "[mock][dp]") {
  // A stream's second token comes after a minute: a stream stays in flight while the test runs.
  mock_engine mock(1, {"--dp", "3", "--itl-ms", "60000"});
  const auto port = mock.ports()[0];
  const auto in_flight = [&](unsigned engine) {
    return [engine](const json& s) { return routed(s, 0, engine, "requests_in_flight") == 1; };
  };
  const std::string held =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 55\r\n\r\n"
      R"({"prompt":"a","max_tokens":2,"stream":true,"x":"xxxxx"})";
  REQUIRE(held.size() - held.find("\r\n\r\n") - 4 == 55);
  http_connection first(port);
  first.write_raw(held);
  CHECK(in_flight(0)(await_until([&] { return stats(mock); }, in_flight(0))));
  http_connection second(port);
  second.write_raw(held);
  CHECK(in_flight(1)(await_until([&] { return stats(mock); }, in_flight(1))));

  // Engines 0 and 1 have a stream each: the idle engine 2 gets the next ones (done at once, so the
  // loads stay 1, 1, 0), then a header still overrides the balance.
  CHECK(engine_of(send(port, completion(std::nullopt))) == "2");
  CHECK(engine_of(send(port, completion(std::nullopt))) == "2");
  CHECK(engine_of(send(port, completion("0"))) == "0");
  const auto s = stats(mock);
  CHECK(routed(s, 0, 0, "requests_in_flight") == 1);
  CHECK(routed(s, 0, 2) == 2);
}

TEST_CASE("mock dp: /metrics shows each engine once with its engine label, overrides and raw text from the admin port",
          "[mock][dp]") {
  mock_engine mock(2, {"--dp", "2"});
  const auto port = mock.ports()[1];
  auto m = scrape_metrics(port);
  for (unsigned j : {0U, 1U}) {
    const auto engine = "{engine=\"" + std::to_string(j) + "\",model_name=\"mock-model\"}";
    CHECK(m.count("vllm:num_requests_running" + engine) == 1);
    CHECK(m.count("vllm:num_requests_waiting" + engine) == 1);
    CHECK(m.count("vllm:kv_cache_usage_perc" + engine) == 1);
  }
  CHECK(m.count(running_key(2)) == 0);

  CHECK(admin(mock, bhttp::verb::post, "/metrics/override?rank=1&engine=1",
              R"({"running":5,"waiting":7,"kv_cache_usage":0.9})") == 200);
  m = scrape_metrics(port);
  CHECK(m.at(running_key(1)) == 5);
  CHECK(m.at("vllm:num_requests_waiting{engine=\"1\",model_name=\"mock-model\"}") == 7);
  CHECK(m.at("vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"mock-model\"}") == Approx(0.9));
  CHECK(m.at(running_key(0)) == 0);
  CHECK(scrape_metrics(mock.ports()[0]).at(running_key(1)) == 0);  // the other port's engine 1: untouched
  CHECK(admin(mock, bhttp::verb::post, "/metrics/override?rank=1&engine=2", "{}") == 400);
  CHECK(admin(mock, bhttp::verb::delete_, "/metrics/override") == 200);
  CHECK(scrape_metrics(port).at(running_key(1)) == 0);

  const std::string raw = "vllm:num_requests_running{engine=\"0\",model_name=\"mock-model\"} NaN\n#garbage{";
  CHECK(admin(mock, bhttp::verb::post, "/metrics/raw?rank=1", raw) == 200);
  CHECK(http_get(port, "/metrics").body == raw);
  CHECK(http_get(mock.admin_port(), "/metrics?rank=1").body == raw);
  CHECK(http_get(mock.ports()[0], "/metrics").body != raw);
  CHECK(admin(mock, bhttp::verb::delete_, "/metrics/raw?rank=1") == 200);
  CHECK(scrape_metrics(port).count(running_key(1)) == 1);
}

TEST_CASE("mock dp: with --dp 1 a port takes 0 or its own rank, and keeps its labels", "[mock][dp]") {
  mock_engine mock(2);
  const auto port = mock.ports()[1];
  CHECK(send(port, completion("1")).status == 200);
  CHECK(send(port, completion("0")).status == 200);
  CHECK(send(port, completion("2")).status == 400);
  CHECK(send(mock.ports()[0], completion("1")).status == 400);
  const auto m = scrape_metrics(port);
  CHECK(m.at("vllm:request_success_total{engine=\"1\",finished_reason=\"length\",model_name=\"mock-model\"}") == 2);
  CHECK(m.count("mock_connections_accepted_total{engine=\"1\"}") == 1);
  CHECK(m.count(running_key(0)) == 0);
  CHECK(mock.process().output().find("serves") == std::string::npos);  // start-up output as before
}

TEST_CASE("mock dp: with --simulate --dp-lockstep every engine of the process steps together", "[mock][dp]") {
  mock_engine mock(2, {"--dp", "2", "--simulate", "--dp-lockstep", "--time-scale", "100"});
  const auto r = send(mock.ports()[1], completion("1", false, 3));
  REQUIRE(r.status == 200);
  CHECK(engine_of(r) == "1");
  const auto steps = [&](unsigned rank, unsigned engine) {
    return mock.metrics(rank).at("mock_steps_total{engine=\"" + std::to_string(engine) + "\"}");
  };
  const auto busy = steps(1, 1);
  CHECK(busy >= 3);  // its 3 tokens, one per step
  CHECK(steps(0, 0) == busy);  // the idle ones ran dummy steps alongside
  CHECK(steps(0, 1) == busy);
  CHECK(steps(1, 0) == busy);
  const auto m = mock.metrics(1);
  CHECK(m.at("mock_real_tokens_total{engine=\"1\"}") >= 3);
  CHECK(m.at("mock_real_tokens_total{engine=\"0\"}") == 0);
}

TEST_CASE("mock dp: --dp-balance oracle sends a prompt to the engine that cached it, within the load bound",
          "[mock][dp][oracle]") {
  mock_engine mock(1, {"--dp", "4", "--simulate", "--time-scale", "100", "--dp-balance", "oracle"});
  const auto port = mock.ports()[0];
  const auto shared = prompt_of("shared", 64);  // 4 blocks of the default 16 tokens
  const auto hits = [&](unsigned engine) {
    return mock.metrics(0).at("vllm:prefix_cache_hits_total{engine=\"" + std::to_string(engine) +
                              "\",model_name=\"mock-model\"}");
  };

  // Engine 2 serves it first (named); its cache keeps the prompt's blocks once the request is done.
  auto r = send(port, completion_of(shared, "2"));
  REQUIRE(r.status == 200);
  REQUIRE(engine_of(r) == "2");
  // The same prompt, no header, an idle port: least-inflight would pick engine 0; the oracle picks the
  // engine holding the prompt, which finds 3 of its 4 blocks cached (the last token is always computed).
  r = send(port, completion_of(shared, std::nullopt));
  REQUIRE(r.status == 200);
  CHECK(engine_of(r) == "2");
  CHECK(hits(2) == 48);
  CHECK(hits(0) + hits(1) + hits(3) == 0);

  // From here the port stalls every request for a minute, so that each stays in flight: requests are
  // sent one by one, each once the previous one is counted, and /stats says where each went.
  mock.set_fault(0, R"({"stall_ms":60000})");
  std::vector<std::unique_ptr<http_connection>> held;
  const auto hold = [&](const std::string& prompt) {
    held.push_back(std::make_unique<http_connection>(port));
    held.back()->write_raw(raw_completion_of(prompt));
    const auto total = held.size();
    const auto s = await_until([&] { return stats(mock); }, [&](const json& st) {
      std::uint64_t in_flight = 0;
      for (unsigned e = 0; e < 4; ++e) in_flight += routed(st, 0, e, "requests_in_flight");
      return in_flight == total;
    });
    std::vector<std::uint64_t> loads;
    for (unsigned e = 0; e < 4; ++e) loads.push_back(routed(s, 0, e, "requests_in_flight"));
    return loads;
  };
  using loads = std::vector<std::uint64_t>;
  // Nothing in flight: the ceiling is ceil(1.25 * 1 / 4) = 1, and the cached prompt goes to engine 2.
  CHECK(hold(shared) == loads{0, 0, 1, 0});
  // Engine 2 would have 2 > ceil(1.25 * 2 / 4) = 1: the bound sends the copy to the least busy engine.
  CHECK(hold(shared) == loads{1, 0, 1, 0});
  // Unrelated prompts match nothing anywhere: they spread as by least-inflight.
  CHECK(hold(prompt_of("other", 64)) == loads{1, 1, 1, 0});
  CHECK(hold(prompt_of("third", 64)) == loads{1, 1, 1, 1});
  // Evenly loaded, the ceiling is ceil(1.25 * 5 / 4) = 2: the cache decides again.
  CHECK(hold(shared) == loads{1, 1, 2, 1});
}
