// Tenants through the real dplb: a request's tenant by its API key or --tenant-header, require_api_key's 401,
// the order of dplb's queue (priority first, then tenants by weight, FIFO within a tenant), rate limits and
// queue limits answered 429 with Retry-After before any engine sees the request, the tenants' metrics, the
// admin API's view and reload, and a burst that still lands exactly even.
//
// The queue's order is read off a raw engine with one slot (--max-inflight-per-rank 1): a first request holds
// the slot until its client leaves, the others queue behind it, and once it leaves they reach the engine one
// at a time, in the order dplb served them.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <exception>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <signal.h>
#include <string>
#include <thread>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "raw_engine.hpp"
#include "temp_file.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// What a client sends: a completion labelled by its prompt, with the headers that name its tenant.
struct ask {
  std::string label;
  std::optional<int> priority = std::nullopt;
  std::string authorization = {};
  std::string tenant_header = {};  // X-Team's value
  int max_tokens = 1;
};

std::string wire(const ask& a) {
  json body{{"model", "mock-model"}, {"prompt", a.label}, {"max_tokens", a.max_tokens}};
  if (a.priority) body["priority"] = *a.priority;
  const auto text = body.dump();
  std::string out = "POST /v1/completions HTTP/1.1\r\nHost: dplb\r\nContent-Type: application/json\r\n";
  if (!a.authorization.empty()) out += "Authorization: " + a.authorization + "\r\n";
  if (!a.tenant_header.empty()) out += "X-Team: " + a.tenant_header + "\r\n";
  return out + "Content-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
}

http_response send(std::uint16_t port, const ask& a) {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::host, "dplb");
  r.set(bhttp::field::content_type, "application/json");
  if (!a.authorization.empty()) r.set(bhttp::field::authorization, a.authorization);
  if (!a.tenant_header.empty()) r.set("X-Team", a.tenant_header);
  json body{{"model", "mock-model"}, {"prompt", a.label}, {"max_tokens", a.max_tokens}};
  if (a.priority) body["priority"] = *a.priority;
  r.body() = body.dump();
  r.prepare_payload();
  http_connection c(port);
  return c.send(r);
}

std::string ok_answer() {
  const std::string body = R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x"}],)"
                           R"("usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}})";
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// One slot: the request whose prompt is "hold" keeps it until its client leaves; every other is answered at once.
raw_engine one_slot_engine() {
  return raw_engine([](const raw_request& r) {
    if (json::parse(r.body).value("prompt", "") == "hold") return std::vector{pause_for(60s), write_bytes(ok_answer())};
    return std::vector{write_bytes(ok_answer())};
  });
}

std::vector<std::string> base_args(const temp_file& config) {
  return {"--config", config.path(), "--health-check-interval-ms", "0", "--max-inflight-per-rank", "1",
          "--tenant-header", "X-Team", "--threads", "2"};
}

const std::string admin_token = "tenants-admin-token-5c1e";

http_response admin_call(std::uint16_t port, bhttp::verb method, const std::string& target) {
  http_connection c(port);
  bhttp::request<bhttp::string_body> request{method, target, 11};
  request.set(bhttp::field::authorization, "Bearer " + admin_token);
  return c.send(request);
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

double queue_depth(std::uint16_t port) { return metric_sum(scrape_metrics(port), "dplb_queue_depth"); }

// Holds the engine's one slot, queues `asks` one after another (each queued before the next is sent), then
// lets the slot go. Returns the labels in the order the engine received them, and each ask's status.
struct queue_run {
  std::vector<std::string> served;
  std::map<std::string, unsigned> status;
};
queue_run run_through_queue(raw_engine& engine, std::uint16_t port, const std::vector<ask>& asks,
                            const std::vector<std::string>& refused_at_once = {}) {
  http_connection holder(port);
  holder.write_raw(wire({"hold"}));
  REQUIRE(engine.await_requests(1, scaled(5s)));
  std::vector<std::unique_ptr<http_connection>> clients;
  std::size_t queued = 0;
  queue_run out;
  for (const auto& a : asks) {
    clients.push_back(std::make_unique<http_connection>(port));
    clients.back()->write_raw(wire(a));
    if (std::ranges::find(refused_at_once, a.label) != refused_at_once.end()) {
      const auto answer = clients.back()->read_responses(1, scaled(5s)).final_responses();
      REQUIRE(answer.size() == 1);
      out.status[a.label] = answer[0].status;
      clients.pop_back();
      continue;
    }
    ++queued;
    const auto depth = await_until([&] { return queue_depth(port); }, [&](double d) { return d == static_cast<double>(queued); });
    REQUIRE(depth == static_cast<double>(queued));
  }
  holder.close();  // dplb closes the engine's connection: the slot frees, and the queue drains
  std::size_t i = 0;
  for (const auto& a : asks) {
    if (out.status.count(a.label)) continue;
    const auto answer = clients[i++]->read_responses(1, scaled(10s)).final_responses();
    REQUIRE(answer.size() == 1);
    out.status[a.label] = answer[0].status;
  }
  for (const auto& r : engine.requests()) {
    const auto label = json::parse(r.body).value("prompt", "");
    if (label != "hold") out.served.push_back(label);
  }
  return out;
}

}  // namespace

TEST_CASE("tenants: a freed slot goes to the lowest priority value first, FIFO among equals, priority forwarded",
          "[tenants][queue]") {
  temp_file config(json{{"tenants", json::array({{{"name", "chat"}, {"api_keys", {"sk-chat"}}}})}}.dump());
  auto engine = one_slot_engine();
  dplb_proxy proxy({engine.url()}, base_args(config));
  const std::vector<ask> asks{{"p0-a", 0}, {"p5-a", 5}, {"m1-a", -1}, {"none", std::nullopt},
                              {"p5-b", 5}, {"m1-b", -1, "Bearer sk-chat"}, {"p3", 3}};
  const auto run = run_through_queue(engine, proxy.port(), asks);
  CHECK(run.served == std::vector<std::string>{"m1-a", "m1-b", "p0-a", "none", "p3", "p5-a", "p5-b"});
  for (const auto& [label, status] : run.status) CHECK(status == 200);
  // The body reaches the engine as the client sent it, priority included.
  for (const auto& r : engine.requests()) {
    if (r.body.find("\"p5-a\"") != std::string::npos) CHECK(r.body == R"({"max_tokens":1,"model":"mock-model","priority":5,"prompt":"p5-a"})");
  }
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_queue_wait_by_priority_seconds_count{", {"band=\"high\""}) == 2);
  CHECK(metric_sum(m, "dplb_queue_wait_by_priority_seconds_count{", {"band=\"normal\""}) == 2);
  CHECK(metric_sum(m, "dplb_queue_wait_by_priority_seconds_count{", {"band=\"low\""}) == 3);
}

TEST_CASE("tenants: a tenant's min_priority raises its requests' priority in dplb's queue and in the body the "
          "engine gets",
          "[tenants][queue]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"min_priority", 5}}, {{"name", "chat"}}})}}.dump());
  auto engine = one_slot_engine();
  dplb_proxy proxy({engine.url()}, base_args(config));
  // batch asks to go first (-100) and to go at the default (none): both are served at 5, after the others.
  const std::vector<ask> asks{{"batch-m100", -100, "", "batch"}, {"batch-none", std::nullopt, "", "batch"},
                              {"chat-3", 3, "", "chat"}, {"default-0", 0}, {"batch-7", 7, "", "batch"}};
  const auto run = run_through_queue(engine, proxy.port(), asks);
  CHECK(run.served == std::vector<std::string>{"default-0", "chat-3", "batch-m100", "batch-none", "batch-7"});
  for (const auto& [label, status] : run.status) CHECK(status == 200);
  std::map<std::string, std::string> bodies;
  for (const auto& r : engine.requests()) bodies[json::parse(r.body).value("prompt", "")] = r.body;
  // Raised: set in place; none: added at the end; others: the client's bytes.
  CHECK(bodies["batch-m100"] == R"({"max_tokens":1,"model":"mock-model","priority":5,"prompt":"batch-m100"})");
  CHECK(bodies["batch-none"] == R"({"max_tokens":1,"model":"mock-model","prompt":"batch-none","priority":5})");
  CHECK(bodies["batch-7"] == R"({"max_tokens":1,"model":"mock-model","priority":7,"prompt":"batch-7"})");
  CHECK(bodies["chat-3"] == R"({"max_tokens":1,"model":"mock-model","priority":3,"prompt":"chat-3"})");
  CHECK(bodies["default-0"] == R"({"max_tokens":1,"model":"mock-model","priority":0,"prompt":"default-0"})");
}

TEST_CASE("tenants: without queueing, a min_priority still reaches the engine's body", "[tenants][limits]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"min_priority", -1}}})}}.dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--tenant-header", "X-Team"});
  CHECK(send(proxy.port(), {"low", -100, "", "batch"}).status == 200);
  CHECK(send(proxy.port(), {"none", std::nullopt, "", "batch"}).status == 200);
  CHECK(send(proxy.port(), {"other", -100}).status == 200);  // default has no min_priority
  REQUIRE(engine.request_count() == 3);
  CHECK(engine.requests()[0].body == R"({"max_tokens":1,"model":"mock-model","priority":-1,"prompt":"low"})");
  CHECK(engine.requests()[1].body == R"({"max_tokens":1,"model":"mock-model","prompt":"none"})");  // 0 is above -1
  CHECK(engine.requests()[2].body == R"({"max_tokens":1,"model":"mock-model","priority":-100,"prompt":"other"})");
}

TEST_CASE("tenants: among equal priorities tenants share freed slots by weight, FIFO within each", "[tenants][queue]") {
  temp_file config(json{{"tenants", json::array({{{"name", "interactive"}, {"weight", 3}},
                                                 {{"name", "batch"}, {"weight", 1}}})}}
                       .dump());
  auto engine = one_slot_engine();
  dplb_proxy proxy({engine.url()}, base_args(config));
  std::vector<ask> asks;
  // The batch tenant queues first: arrival alone would serve all of it first.
  for (int i = 0; i < 8; ++i) asks.push_back({"batch-" + std::to_string(i), std::nullopt, "", "batch"});
  for (int i = 0; i < 8; ++i) asks.push_back({"interactive-" + std::to_string(i), std::nullopt, "", "interactive"});
  const auto run = run_through_queue(engine, proxy.port(), asks);
  REQUIRE(run.served.size() == 16);
  // In the first eight served, three of interactive for each one of batch.
  const auto first8 = std::vector<std::string>(run.served.begin(), run.served.begin() + 8);
  const auto interactive = std::ranges::count_if(first8, [](const std::string& s) { return s.starts_with("interactive"); });
  CHECK(interactive == 6);
  // FIFO within each tenant.
  std::vector<std::string> batch_order, interactive_order;
  for (const auto& s : run.served) (s.starts_with("batch") ? batch_order : interactive_order).push_back(s);
  CHECK(std::ranges::is_sorted(batch_order));
  CHECK(std::ranges::is_sorted(interactive_order));
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"interactive\"", "code=\"200\""}) == 8);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"200\""}) == 8);
  CHECK(metric_sum(m, "dplb_tenant_queued{") == 0);
  CHECK(metric_sum(m, "dplb_tenant_in_flight{") == 0);
}

TEST_CASE("tenants: over requests_per_second a tenant gets 429 with Retry-After, no engine sees it, others go on",
          "[tenants][limits]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"api_keys", {"sk-batch"}},
                                                  {"requests_per_second", 0.5}, {"burst", 2}},
                                                 {{"name", "chat"}, {"api_keys", {"sk-chat"}}}})}}
                       .dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0"});
  CHECK(send(proxy.port(), {"b1", std::nullopt, "Bearer sk-batch"}).status == 200);
  CHECK(send(proxy.port(), {"b2", std::nullopt, "Bearer sk-batch"}).status == 200);
  const auto refused = send(proxy.port(), {"b3", std::nullopt, "Bearer sk-batch"});
  CHECK(refused.status == 429);
  const auto retry_after = std::stoi(std::string(refused.headers["retry-after"]));
  CHECK(retry_after >= 1);
  CHECK(retry_after <= 2);  // one unit at 0.5 a second
  const auto error = json::parse(refused.body);
  CHECK(error["error"]["type"] == "RateLimitError");
  CHECK(error["error"]["code"] == 429);
  CHECK_THAT(error["error"]["message"].get<std::string>(), Catch::Contains("batch") && Catch::Contains("requests_per_second"));
  CHECK_THAT(refused.body, !Catch::Contains("sk-batch"));
  for (int i = 0; i < 5; ++i) CHECK(send(proxy.port(), {"c" + std::to_string(i), std::nullopt, "Bearer sk-chat"}).status == 200);
  CHECK(engine.request_count() == 7);  // b3 never reached it
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"200\""}) == 2);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"429\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"chat\"", "code=\"200\""}) == 5);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"chat\"", "code=\"429\""}) == 0);
  CHECK(metric_sum(m, "dplb_tenant_tokens_total{", {"tenant=\"chat\"", "kind=\"prompt\""}) == 15);
  CHECK(metric_sum(m, "dplb_tenant_tokens_total{", {"tenant=\"chat\"", "kind=\"completion\""}) == 5);
}

TEST_CASE("tenants: require_api_key answers 401 without a known key, forwards Authorization unchanged, and keys "
          "never show",
          "[tenants][keys]") {
  // The batch key is configured by its digest only: sha256("sk-batch").
  temp_file config(json{{"require_api_key", true},
                        {"tenants", json::array({{{"name", "chat"}, {"api_keys", {"sk-chat"}}},
                                                 {{"name", "batch"},
                                                  {"api_key_sha256",
                                                   {"38fcc73a9dc613f145bed24eb4123f92105c78567a6e563d43dbcb1f29927864"}}}})}}
                       .dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  const temp_file access_log;
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--access-log",
                                    access_log.path()});
  for (const std::string& authorization : {std::string{}, std::string{"Bearer sk-wrong"}, std::string{"sk-chat"}}) {
    const auto r = send(proxy.port(), {"x", std::nullopt, authorization});
    CHECK(r.status == 401);
    CHECK(r.headers["www-authenticate"] == "Bearer");
    CHECK(json::parse(r.body)["error"]["type"] == "AuthenticationError");
  }
  // Refused on its head alone: no 100 Continue invites the body of a request without a key.
  http_connection expecting(proxy.port());
  expecting.write_raw("POST /v1/completions HTTP/1.1\r\nHost: dplb\r\nContent-Type: application/json\r\n"
                      "Expect: 100-continue\r\nContent-Length: 100000\r\n\r\n");
  const auto early = expecting.read_responses(1, scaled(5s));
  CHECK_FALSE(early.has_interim());
  REQUIRE(early.final_responses().size() == 1);
  CHECK(early.final_responses()[0].status == 401);
  CHECK(engine.request_count() == 0);
  CHECK(http_get(proxy.port(), "/health").status == 200);
  CHECK(http_get(proxy.port(), "/metrics").status == 200);
  CHECK(send(proxy.port(), {"chat", std::nullopt, "Bearer sk-chat"}).status == 200);
  CHECK(send(proxy.port(), {"batch", std::nullopt, "bearer   sk-batch"}).status == 200);
  REQUIRE(engine.request_count() == 2);
  CHECK(engine.requests()[0].header_values("authorization") == std::vector<std::string>{"Bearer sk-chat"});
  CHECK(engine.requests()[1].header_values("authorization") == std::vector<std::string>{"bearer   sk-batch"});
  const auto metrics_text = http_get(proxy.port(), "/metrics").body;
  CHECK_THAT(metrics_text, Catch::Contains("dplb_tenant_requests_total{tenant=\"default\",code=\"401\"} 4"));
  CHECK_THAT(metrics_text, Catch::Contains("dplb_tenant_requests_total{tenant=\"batch\",code=\"200\"} 1"));
  CHECK_THAT(metrics_text, !Catch::Contains("sk-chat") && !Catch::Contains("38fcc73a"));
  // The access log names tenants, never keys.
  // (Each line is written once its request is done, on the log's own schedule: awaited until both are there.)
  const auto lines = await_until([&] { return file_text(access_log.path()); }, [](const std::string& text) {
    return text.find(R"("tenant":"chat")") != std::string::npos && text.find(R"("tenant":"batch")") != std::string::npos;
  });
  CHECK_THAT(lines, Catch::Contains(R"("tenant":"chat")") && Catch::Contains(R"("tenant":"batch")"));
  CHECK_THAT(lines, !Catch::Contains("sk-chat") && !Catch::Contains("sk-batch") && !Catch::Contains("sk-wrong"));
}

TEST_CASE("tenants: --tenant-header names a configured tenant, an unknown name counts as default, a key wins",
          "[tenants][keys]") {
  temp_file config(json{{"tenants", json::array({{{"name", "chat"}, {"api_keys", {"sk-chat"}}}, {{"name", "batch"}}})}}.dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--tenant-header", "X-Team"});
  CHECK(send(proxy.port(), {"a", std::nullopt, "", "batch"}).status == 200);
  CHECK(send(proxy.port(), {"b", std::nullopt, "", "no-such-team"}).status == 200);
  CHECK(send(proxy.port(), {"c", std::nullopt, "Bearer sk-chat", "batch"}).status == 200);
  CHECK(send(proxy.port(), {"d", std::nullopt, "Bearer sk-unknown"}).status == 200);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"chat\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"default\""}) == 2);
  // No series for a name that is not configured: the labels are bounded by the configuration.
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"no-such-team\""}) == 0);
  CHECK(engine.request_count() == 4);
}

TEST_CASE("tenants: --tenant-header never selects a tenant that holds keys: without its key a request counts as "
          "default, and the tenant's own client keeps its limit",
          "[tenants][keys]") {
  // One request at a time for chat (burst 1, one a minute): a request counted as chat's spends it.
  temp_file config(json{{"tenants", json::array({{{"name", "chat"}, {"api_keys", {"sk-chat"}},
                                                  {"requests_per_second", 1.0 / 60}, {"burst", 1}}})}}
                       .dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--tenant-header", "X-Team"});
  for (const std::string label : {"a", "b", "c"}) CHECK(send(proxy.port(), {label, std::nullopt, "", "chat"}).status == 200);
  CHECK(send(proxy.port(), {"d", std::nullopt, "Bearer sk-wrong", "chat"}).status == 200);
  // The tenant's own client still has its one request.
  CHECK(send(proxy.port(), {"own", std::nullopt, "Bearer sk-chat"}).status == 200);
  CHECK(send(proxy.port(), {"own-2", std::nullopt, "Bearer sk-chat"}).status == 429);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"default\"", "code=\"200\""}) == 4);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"chat\"", "code=\"200\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"chat\"", "code=\"429\""}) == 1);
  CHECK(engine.request_count() == 5);
}

TEST_CASE("tenants: under require_api_key, naming a keyed tenant in --tenant-header without its key is a 401",
          "[tenants][keys]") {
  temp_file config(json{{"require_api_key", true},
                        {"tenants", json::array({{{"name", "chat"}, {"api_keys", {"sk-chat"}}}})}}
                       .dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--tenant-header", "X-Team"});
  CHECK(send(proxy.port(), {"a", std::nullopt, "", "chat"}).status == 401);
  CHECK(send(proxy.port(), {"b", std::nullopt, "Bearer sk-chat", "chat"}).status == 200);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"default\"", "code=\"401\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"chat\""}) == 1);
  CHECK(engine.request_count() == 1);
}

TEST_CASE("tenants: over max_queued a tenant gets 429 with Retry-After at once, others still queue", "[tenants][queue]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"max_queued", 1}}, {{"name", "chat"}}})}}.dump());
  auto engine = one_slot_engine();
  dplb_proxy proxy({engine.url()}, base_args(config));
  const std::vector<ask> asks{{"batch-1", std::nullopt, "", "batch"}, {"batch-2", std::nullopt, "", "batch"},
                              {"chat-1", std::nullopt, "", "chat"}};
  const auto run = run_through_queue(engine, proxy.port(), asks, {"batch-2"});
  CHECK(run.status.at("batch-2") == 429);
  CHECK(run.served == std::vector<std::string>{"batch-1", "chat-1"});
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"429\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"chat\"", "code=\"200\""}) == 1);
}

TEST_CASE("tenants: a request that would wait past --max-queue-wait-ms gets 429 with Retry-After, and a tenant's own "
          "max_queue_wait_ms overrides it",
          "[tenants][queue]") {
  temp_file config(json{{"tenants", json::array({{{"name", "patient"}, {"max_queue_wait_ms", 60000}}})}}.dump());
  auto engine = one_slot_engine();
  auto args = base_args(config);
  args.insert(args.end(), {"--max-queue-wait-ms", "300"});
  dplb_proxy proxy({engine.url()}, args);
  http_connection holder(proxy.port());
  holder.write_raw(wire({"hold"}));
  REQUIRE(engine.await_requests(1, scaled(5s)));
  http_connection patient(proxy.port());
  patient.write_raw(wire({"patient", std::nullopt, "", "patient"}));
  const auto started = steady::now();
  const auto refused = send(proxy.port(), {"impatient"});
  CHECK(refused.status == 429);
  CHECK(steady::now() - started >= 250ms);
  CHECK(std::stoi(std::string(refused.headers["retry-after"])) >= 1);
  CHECK_THAT(refused.body, Catch::Contains("--max-queue-wait-ms"));
  // The patient one still waits; once the slot frees it is served.
  CHECK(queue_depth(proxy.port()) == 1);
  holder.close();
  const auto served = patient.read_responses(1, scaled(10s)).final_responses();
  REQUIRE(served.size() == 1);
  CHECK(served[0].status == 200);
  std::vector<std::string> seen;
  for (const auto& r : engine.requests()) seen.push_back(json::parse(r.body).value("prompt", ""));
  CHECK(seen == std::vector<std::string>{"hold", "patient"});  // the refused one never reached the engine
}

TEST_CASE("tenants: with tenants configured and no limit hit, a burst of 256 lands exactly 64 per rank",
          "[tenants][burst]") {
  temp_file config(json{{"tenants", json::array({{{"name", "a"}, {"api_keys", {"sk-a"}}, {"weight", 3}, {"requests_per_second", 100000}},
                                                 {{"name", "b"}, {"api_keys", {"sk-b"}}, {"max_queued", 1000}}})}}
                       .dump());
  mock_engine engine(4, {"--ttft-ms", std::to_string(scaled(1500ms).count())});
  dplb_proxy proxy(engine.urls(), {"--config", config.path(), "--policy", "least-inflight"});
  std::vector<std::unique_ptr<http_connection>> clients;
  for (int i = 0; i < 256; ++i) {
    clients.push_back(std::make_unique<http_connection>(proxy.port()));
    clients.back()->write_raw(wire({"burst " + std::to_string(i), std::nullopt, i % 2 ? "Bearer sk-a" : "Bearer sk-b"}));
  }
  std::map<std::string, int> per_rank;
  for (auto& c : clients) {
    const auto answer = c->read_responses(1, scaled(30s)).final_responses();
    REQUIRE(answer.size() == 1);
    REQUIRE(answer[0].status == 200);
    ++per_rank[answer[0].header("x-dplb-rank").value_or("none")];
  }
  CHECK(per_rank == std::map<std::string, int>{{"0", 64}, {"1", 64}, {"2", 64}, {"3", 64}});
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"a\"", "code=\"200\""}) == 128);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"b\"", "code=\"200\""}) == 128);
  CHECK(metric_sum(m, "dplb_tenant_in_flight{") == 0);
}

TEST_CASE("tenants: the admin API shows each tenant, and a reload changes them without dropping a queued request",
          "[tenants][admin]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"weight", 1}, {"requests_per_second", 50}}})}}.dump());
  auto engine = one_slot_engine();
  const temp_file token_file(admin_token + "\n");
  auto args = base_args(config);
  args.insert(args.end(), {"--admin-listen", "127.0.0.1:0", "--admin-token-file", token_file.path()});
  dplb_proxy proxy({engine.url()}, args);
  http_connection holder(proxy.port());
  holder.write_raw(wire({"hold"}));
  REQUIRE(engine.await_requests(1, scaled(5s)));
  http_connection queued(proxy.port());
  queued.write_raw(wire({"queued", std::nullopt, "", "batch"}));
  REQUIRE(await_until([&] { return queue_depth(proxy.port()); }, [](double d) { return d == 1; }) == 1);

  const auto listed = json::parse(admin_call(proxy.admin_port(), bhttp::verb::get, "/tenants").body);
  REQUIRE(listed["tenants"].size() == 2);
  CHECK(listed["tenants"][0]["name"] == "default");
  const auto& batch = listed["tenants"][1];
  CHECK(batch["name"] == "batch");
  CHECK(batch["queued"] == 1);
  CHECK(batch["limits"]["requests_per_second"] == 50);
  CHECK(batch["limits"]["burst"] == 50);
  CHECK(batch["limits"]["min_priority"] == nullptr);

  config.write(json{{"tenants", json::array({{{"name", "batch"}, {"weight", 4}, {"min_priority", 2}}, {{"name", "research"}}})}}.dump());
  const auto reloaded = admin_call(proxy.admin_port(), bhttp::verb::post, "/tenants/reload");
  REQUIRE(reloaded.status == 200);
  const auto after = json::parse(reloaded.body);
  REQUIRE(after["tenants"].size() == 3);
  CHECK(after["tenants"][1]["weight"] == 4);
  CHECK(after["tenants"][1]["queued"] == 1);  // kept across the reload
  CHECK(after["tenants"][1]["limits"]["min_priority"] == 2);
  CHECK(after["tenants"][2]["name"] == "research");

  config.write("{ not json");
  CHECK(admin_call(proxy.admin_port(), bhttp::verb::post, "/tenants/reload").status == 400);

  holder.close();
  const auto served = queued.read_responses(1, scaled(10s)).final_responses();
  REQUIRE(served.size() == 1);
  CHECK(served[0].status == 200);
  CHECK(metric_sum(scrape_metrics(proxy.port()), "dplb_tenant_queued{") == 0);
}

TEST_CASE("tenants: a token budget reserves prompt and max_tokens, is corrected by the usage, and refuses with "
          "Retry-After",
          "[tenants][limits]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"tokens_per_minute", 600}}})}}.dump());
  // The usage says 4 tokens, or 550 for the prompt "long".
  raw_engine engine([](const raw_request& r) {
    if (json::parse(r.body).value("prompt", "") != "long") return std::vector{write_bytes(ok_answer())};
    const std::string body = R"({"id":"cmpl-2","object":"text_completion","choices":[{"index":0,"text":"x"}],)"
                             R"("usage":{"prompt_tokens":50,"completion_tokens":500,"total_tokens":550}})";
    return std::vector{write_bytes("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n" + body)};
  });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--tenant-header", "X-Team"});
  // 501 reserved of 600; the usage (4) gives 497 back, so the same request fits again, and again.
  for (int i = 0; i < 3; ++i) CHECK(send(proxy.port(), {"x", std::nullopt, "", "batch", 500}).status == 200);
  // Larger than the whole minute's budget: refused for good, saying so (see the request_too_large test).
  const auto too_large = send(proxy.port(), {"x", std::nullopt, "", "batch", 700});
  CHECK(too_large.status == 400);
  CHECK_THAT(too_large.body, Catch::Contains("tokens_per_minute"));
  // 550 used against 2 reserved: the budget is charged, and the next large request waits for the refill.
  CHECK(send(proxy.port(), {"long", std::nullopt, "", "batch", 1}).status == 200);
  const auto over = send(proxy.port(), {"x", std::nullopt, "", "batch", 500});
  CHECK(over.status == 429);
  const auto retry_after = std::stoi(std::string(over.headers["retry-after"]));
  CHECK(retry_after >= 40);  // ~450 tokens missing at 10 a second
  CHECK(retry_after <= 60);
  CHECK(engine.request_count() == 4);
  // Other tenants have no budget: the default one is not refused.
  CHECK(send(proxy.port(), {"x", std::nullopt, "", "", 700}).status == 200);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_tokens_total{", {"tenant=\"batch\"", "kind=\"completion\""}) == 503);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"429\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"400\""}) == 1);
}

TEST_CASE("tenants: a request larger than its tenant's whole token budget gets 400 request_too_large, no "
          "Retry-After, and no engine sees it",
          "[tenants][limits]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"tokens_per_minute", 600}}})}}.dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--tenant-header", "X-Team"});
  // The prompt "x" is one token: 1 + 700 against a budget 600 deep.
  const auto refused = send(proxy.port(), {"x", std::nullopt, "", "batch", 700});
  CHECK(refused.status == 400);
  CHECK(refused.headers.count("retry-after") == 0);
  const auto error = json::parse(refused.body)["error"];
  CHECK(error["code"] == "request_too_large");
  CHECK(error["type"] == "BadRequestError");
  const auto message = error["message"].get<std::string>();
  CHECK_THAT(message, Catch::Contains("701") && Catch::Contains("tokens_per_minute 600") && Catch::Contains("batch"));
  CHECK(engine.request_count() == 0);
  // Nothing was taken from the budget: a request that fits goes through at once.
  CHECK(send(proxy.port(), {"x", std::nullopt, "", "batch", 599}).status == 200);
  CHECK(engine.request_count() == 1);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_rejected_requests_total{", {"code=\"400\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"400\""}) == 1);
}

namespace {

// A stream of the batch tenant's without max_tokens (the engine's own default applies) and without
// stream_options.include_usage: no usage comes back. `prompt`: its text.
struct stream_result {
  unsigned status = 0;
  std::uint64_t events = 0;  // data events but [DONE]: one per generated token (the mock's, as vLLM's)
  std::int64_t retry_after = 0;
};
stream_result stream_without_limit(std::uint16_t port, const std::string& prompt, std::optional<int> max_tokens = {}) {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::host, "dplb");
  r.set(bhttp::field::content_type, "application/json");
  r.set("X-Team", "batch");
  json body{{"model", "mock-model"}, {"prompt", prompt}, {"stream", true}};
  if (max_tokens) body["max_tokens"] = *max_tokens;
  r.body() = body.dump();
  r.prepare_payload();
  http_connection c(port);
  const auto answer = c.send(r, scaled(30s));
  stream_result out{answer.status};
  if (answer.status == 429) out.retry_after = std::stoll(std::string(answer.headers["retry-after"]));
  if (answer.status != 200) return out;
  for (std::size_t at = 0; (at = answer.body.find("data: ", at)) != std::string::npos; at += 6) {
    if (answer.body.compare(at, 12, "data: [DONE]") != 0) ++out.events;
  }
  return out;
}

}  // namespace

TEST_CASE("tenants: tokens_per_minute holds within 10% for streams with neither max_tokens nor usage",
          "[tenants][limits]") {
  // 6000 a minute: 100 a second, 6000 deep. The mock streams 2000 tokens for a request without max_tokens,
  // at once (--itl-ms 0), one event each, and lists mock-model with max_model_len 8192.
  constexpr double per_minute = 6000;
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}, {"tokens_per_minute", per_minute}}})}}.dump());
  mock_engine engine(1, {"--default-max-tokens", "2000", "--itl-ms", "0", "--ttft-ms", "0"});
  dplb_proxy proxy(engine.urls(), {"--config", config.path(), "--tenant-header", "X-Team"});

  // The first request without max_tokens has dplb read the engines' /v1/models (on its side channel). This one's
  // prompt alone (7000 tokens, estimated) is over the budget: refused, and nothing is taken.
  CHECK(stream_without_limit(proxy.port(), std::string(28000, 'x')).status == 400);
  REQUIRE(proxy.process().wait_for_line(std::regex("max_model_len.*mock-model \\(cluster 0\\) 8192"), scaled(10s)));

  const auto started = steady::now();
  std::atomic<std::uint64_t> served{0};  // prompt and completion tokens streamed to the tenant's clients
  // A stream without max_tokens reserves the rest of the context, 8191, at most the whole budget: all 6000. It
  // is charged what it streamed (2001), so that a request of 3001 fits at once after it.
  const auto first = stream_without_limit(proxy.port(), "x");
  REQUIRE(first.status == 200);
  CHECK(first.events == 2000);
  served += 1 + first.events;
  const auto bounded = stream_without_limit(proxy.port(), "x", 3000);
  REQUIRE(bounded.status == 200);
  served += 1 + bounded.events;

  // Four clients stream without max_tokens for 3 s, each waiting as Retry-After says when refused.
  std::atomic<int> refused{0};
  std::atomic<int> unexpected{0};  // counted here, checked once the clients are done (Catch is not thread-safe)
  const auto until = steady::now() + 3s;
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      try {  // a throw out of a thread would end the whole test program
        while (steady::now() < until) {
          const auto r = stream_without_limit(proxy.port(), "x");
          if (r.status == 200) {
            served += 1 + r.events;
          } else if (r.status == 429) {
            ++refused;
            std::this_thread::sleep_until(std::min(until, steady::now() + std::chrono::seconds(r.retry_after)));
          } else {
            ++unexpected;
            return;
          }
        }
      } catch (const std::exception&) {
        ++unexpected;
      }
    });
  }
  for (auto& c : clients) c.join();
  CHECK(unexpected.load() == 0);
  const double elapsed = std::chrono::duration<double>(steady::now() - started).count();
  // What the budget allows over the run: its depth, full at the start, and its refill since.
  const double allowed = per_minute + per_minute / 60 * elapsed;
  INFO("served " << served.load() << " tokens in " << elapsed << " s; the budget allows " << allowed);
  CHECK(static_cast<double>(served.load()) <= 1.1 * allowed);
  CHECK(refused.load() > 0);
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"batch\"", "code=\"429\""}) == refused.load());
}

TEST_CASE("tenants: fair by tokens, a tenant of long requests gets fewer of the freed slots", "[tenants][queue]") {
  temp_file config(json{{"fair_by", "tokens"}, {"tenants", json::array({{{"name", "long"}}, {{"name", "short"}}})}}.dump());
  auto engine = one_slot_engine();
  dplb_proxy proxy({engine.url()}, base_args(config));
  std::vector<ask> asks;
  // Each long request costs 31 (one prompt token and 30), each short one 11: equal weights share tokens.
  for (int i = 0; i < 6; ++i) asks.push_back({"long-" + std::to_string(i), std::nullopt, "", "long", 30});
  for (int i = 0; i < 6; ++i) asks.push_back({"short-" + std::to_string(i), std::nullopt, "", "short", 10});
  const auto run = run_through_queue(engine, proxy.port(), asks);
  REQUIRE(run.served.size() == 12);
  CHECK(std::vector<std::string>(run.served.begin(), run.served.begin() + 8) ==
        std::vector<std::string>{"long-0", "short-0", "short-1", "short-2", "long-1", "short-3", "short-4", "short-5"});
}

TEST_CASE("tenants: SIGHUP reloads the tenants", "[tenants][reload]") {
  temp_file config(json{{"tenants", json::array({{{"name", "batch"}}})}}.dump());
  raw_engine engine([](const raw_request&) { return std::vector{write_bytes(ok_answer())}; });
  dplb_proxy proxy({engine.url()}, {"--config", config.path(), "--health-check-interval-ms", "0", "--tenant-header", "X-Team"});
  CHECK(send(proxy.port(), {"a", std::nullopt, "", "research"}).status == 200);  // not configured: default
  config.write(json{{"tenants", json::array({{{"name", "batch"}}, {{"name", "research"}, {"requests_per_second", 0.1}}})}}.dump());
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  REQUIRE(proxy.process().wait_for_line(std::regex("SIGHUP: tenants reloaded \\(2 configured\\)"), scaled(5s)));
  CHECK(send(proxy.port(), {"b", std::nullopt, "", "research"}).status == 200);
  CHECK(send(proxy.port(), {"c", std::nullopt, "", "research"}).status == 429);  // its limit applies now
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"default\""}) == 1);
  CHECK(metric_sum(m, "dplb_tenant_requests_total{", {"tenant=\"research\""}) == 2);
}
