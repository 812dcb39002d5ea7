// Reliability under faults, bad input and shutdown: the real dplb against the mock engine's fault modes.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

bhttp::request<bhttp::string_body> completion(int max_tokens, bool stream) {
  json body{{"prompt", "a b c"}, {"max_tokens", max_tokens}, {"stream", stream}};
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::content_type, "application/json");
  r.body() = body.dump();
  return r;
}

std::string wire(bhttp::request<bhttp::string_body> r) {
  r.set(bhttp::field::host, "x");
  r.prepare_payload();
  std::ostringstream os;
  os << r;
  return os.str();
}



std::string header(const http_response& r, std::string_view name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? std::string() : std::string(it->value());
}

std::string rank_label(int rank) { return "rank=\"" + std::to_string(rank) + "\""; }

// A client sends a request, sees it wait in dplb's queue (the only waiter), and closes its connection.
void leave_while_queued(unsigned short port) {
  http_connection leaving(port);
  leaving.write_raw(wire(completion(1, false)));
  const auto m = await_metrics(port, [](const auto& m) { return metric_sum(m, "dplb_queue_depth") == 1; });
  REQUIRE(metric_sum(m, "dplb_queue_depth") == 1);
  leaving.close();
}

}  // namespace

TEST_CASE("active health checks take a rank out and bring it back", "[reliability][health]") {
  mock_engine engine(3);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "50", "--unhealthy-threshold", "2",
                                   "--healthy-threshold", "2", "--policy", "round-robin"});
  engine.set_fault(1, R"({"health_status": 503})");
  auto m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_healthy{", {rank_label(1)}) == 0; });
  REQUIRE(metric_sum(m, "dplb_rank_healthy{", {rank_label(1)}) == 0);
  CHECK(metric_sum(m, "dplb_rank_healthy{", {rank_label(0)}) == 1);

  http_connection client(proxy.port());
  for (int i = 0; i < 20; ++i) {
    auto r = client.send(completion(1, false));
    REQUIRE(r.status == 200);
    CHECK(header(r, "x-dplb-rank") != "1");
  }
  engine.clear_fault(1);
  m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_healthy{", {rank_label(1)}) == 1; });
  REQUIRE(metric_sum(m, "dplb_rank_healthy{", {rank_label(1)}) == 1);
  std::set<std::string> seen;
  for (int i = 0; i < 6; ++i) seen.insert(header(client.send(completion(1, false)), "x-dplb-rank"));
  CHECK(seen == std::set<std::string>{"0", "1", "2"});
}

TEST_CASE("consecutive 5xx eject a rank for a back-off that doubles", "[reliability][ejection]") {
  mock_engine engine(2);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--ejection-threshold", "3",
                                   "--ejection-base-ms", "400", "--policy", "round-robin"});
  engine.set_fault(1, R"({"status": 500})");
  http_connection client(proxy.port());
  int errors = 0;
  for (int i = 0; i < 6; ++i) errors += client.send(completion(1, false)).status == 500 ? 1 : 0;
  CHECK(errors == 3);  // rank 1 answered 500 three times, then was ejected
  auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_rank_ejected{", {rank_label(1)}) == 1);
  CHECK(metric_sum(m, "dplb_rank_ejections_total{", {rank_label(1)}) == 1);
  CHECK(metric_sum(m, "dplb_upstream_errors_total{", {rank_label(1), "kind=\"server_error\""}) == 3);
  for (int i = 0; i < 10; ++i) CHECK(header(client.send(completion(1, false)), "x-dplb-rank") == "0");

  // Readmitted after the base back-off; still failing, it is ejected again for twice as long.
  const auto readmitted = [&](std::chrono::milliseconds deadline) {
    const auto t0 = steady::now();
    auto after = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_ejected{", {rank_label(1)}) == 0; },
                               deadline);
    return std::pair{metric_sum(after, "dplb_rank_ejected{", {rank_label(1)}) == 0, steady::now() - t0};
  };
  auto [first_back, first_wait] = readmitted(3s);
  REQUIRE(first_back);
  for (int i = 0; i < 6; ++i) client.send(completion(1, false));
  m = scrape_metrics(proxy.port());
  REQUIRE(metric_sum(m, "dplb_rank_ejections_total{", {rank_label(1)}) == 2);
  auto [second_back, second_wait] = readmitted(5s);
  REQUIRE(second_back);
  CHECK(second_wait >= 700ms);  // 800 ms, measured from a little after it began
  CHECK(first_wait <= 600ms * timing_slack());
}

TEST_CASE("a refused connection is retried on another rank, invisibly", "[reliability][retry]") {
  mock_engine engine(4);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--ejection-threshold", "0",
                                   "--policy", "round-robin"});
  engine.set_fault(1, R"({"listening": false})");
  http_connection client(proxy.port());
  for (int i = 0; i < 20; ++i) {
    auto r = client.send(completion(1, false));
    REQUIRE(r.status == 200);
    CHECK(header(r, "x-dplb-rank") != "1");
  }
  auto m = scrape_metrics(proxy.port());
  // The rotation runs 0, 1 (refused) -> 2, 3, 0, 1 -> 2, ...: every third request meets rank 1 first.
  // 20 requests consume 26 picks: 7 retries.
  CHECK(metric_sum(m, "dplb_retries_total") == 7);
  CHECK(metric_sum(m, "dplb_upstream_errors_total{", {rank_label(1), "kind=\"connect\""}) == 7);
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
}

TEST_CASE("a reset before any answer is retried elsewhere, and a reset mid-stream is never retried", "[reliability][retry]") {
  mock_engine engine(2);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--ejection-threshold", "0",
                                   "--policy", "round-robin"});
  SECTION("reset on request") {
    engine.set_fault(0, R"({"reset_on_request": true})");
    http_connection client(proxy.port());
    for (int i = 0; i < 4; ++i) {
      auto r = client.send(completion(1, false));
      REQUIRE(r.status == 200);
      CHECK(header(r, "x-dplb-rank") == "1");
    }
    // Each request is picked for rank 0 first (the rotation resumes after rank 1), reset, and re-sent.
    auto m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_retries_total") == 4);
    CHECK(metric_sum(m, "dplb_upstream_errors_total{", {rank_label(0), "kind=\"reset\""}) == 4);
  }
  SECTION("reset after 3 events: the client sees a truncated stream at once") {
    engine.set_fault(0, R"({"reset_after_events": 3})");
    http_connection client(proxy.port());
    auto r = client.send_streaming(completion(50, true), 10s);
    CHECK(r.status == 200);
    CHECK(header(r, "x-dplb-rank") == "0");
    CHECK_FALSE(r.complete);
    CHECK(r.body.find("[DONE]") == std::string::npos);
    auto m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_retries_total") == 0);
    CHECK(metric_sum(m, "dplb_upstream_errors_total{", {rank_label(0), "kind=\"midstream\""}) == 1);
    CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
    // The broken connection was not pooled: the next request to rank 0 opens a new one.
    http_connection again(proxy.port());
    again.send(completion(1, false));  // rank 1
    engine.clear_fault(0);
    again.send(completion(1, false));  // rank 0
    m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_upstream_connections_total{", {rank_label(0)}) == 2);
  }
}

TEST_CASE("when the client goes away the engine sees the close within 100 ms", "[reliability][disconnect]") {
  const bool streaming = GENERATE(false, true);
  // Waiting for the first token (5 s), or in the middle of a stream (a token every 50 ms).
  mock_engine engine(1, {"--ttft-ms", streaming ? "0" : "5000", "--itl-ms", "50"});
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0"});
  steady::time_point closed_at;
  {
    http_connection client(proxy.port());
    client.write_raw(wire(completion(1000, streaming)));
    auto running = await_until([&] { return engine.metrics(0); },
                               [](const auto& m) { return metric_sum(m, "vllm:num_requests_running") == 1; });
    REQUIRE(metric_sum(running, "vllm:num_requests_running") == 1);
    if (streaming) std::this_thread::sleep_for(120ms);  // a few events are flowing
    closed_at = steady::now();
  }
  auto m = await_until([&] { return engine.metrics(0); },
                       [](const auto& m) { return metric_sum(m, "mock_requests_aborted_total") == 1; }, 2s);
  const auto noticed = std::chrono::duration<double, std::milli>(steady::now() - closed_at).count();
  REQUIRE(metric_sum(m, "mock_requests_aborted_total") == 1);
  WARN("engine saw the client's close after at most " << noticed << " ms (streaming: " << streaming << ")");
  CHECK(noticed < 100 * timing_slack());
  auto pm = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_inflight{") == 0; });
  CHECK(metric_sum(pm, "dplb_rank_inflight{") == 0);
  CHECK(metric_sum(pm, "dplb_requests_total{", {"code=\"499\""}) == 1);
}

TEST_CASE("no usable rank: 503 in OpenAI's shape with Retry-After, and /health says 503", "[reliability][health]") {
  mock_engine engine(2);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "50", "--unhealthy-threshold", "1"});
  engine.set_fault(0, R"({"health_status": 503})");
  engine.set_fault(1, R"({"health_status": 503})");
  auto health = await_until([&] { return http_get(proxy.port(), "/health"); }, [](const auto& r) { return r.status == 503; });
  CHECK(health.status == 503);
  auto r = http_post_json(proxy.port(), "/v1/completions", R"({"prompt":"x","max_tokens":1})");
  CHECK(r.status == 503);
  CHECK(header(r, "retry-after") == "1");
  auto body = json::parse(r.body);
  CHECK(body["error"]["code"] == 503);
  CHECK(body["error"]["type"] == "ServiceUnavailableError");
  CHECK_FALSE(body["error"]["message"].get<std::string>().empty());
}

TEST_CASE("limits: body 413, head 431, and both close with an OpenAI error", "[reliability][limits]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--max-request-body-bytes", "1000",
                                   "--max-header-bytes", "2000"});
  {
    http_connection c(proxy.port());
    REQUIRE(c.send(completion(1, false), 5s).status == 200);  // a request within the limits passes
  }
  http_connection big_body(proxy.port());
  auto request = completion(1, false);
  request.body() = std::string(5000, 'x');
  auto r = big_body.send(request, 5s);
  CHECK(r.status == 413);
  CHECK(json::parse(r.body)["error"]["code"] == 413);

  http_connection big_head(proxy.port());
  auto request2 = completion(1, false);
  request2.set("x-padding", std::string(3000, 'p'));
  r = big_head.send(request2, 5s);
  CHECK(r.status == 431);
  CHECK(metric_sum(engine.metrics(0), "mock_requests_received_total") == 1);  // only the one that fit
}

TEST_CASE("timeouts: slow request head, idle keep-alive, slow first byte", "[reliability][timeouts]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--client-idle-timeout-ms", "300",
                                   "--upstream-first-byte-timeout-ms", "300"});
  SECTION("a head that never ends is cut off at the deadline and counted as 408 (slowloris)") {
    http_connection c(proxy.port());
    const auto t0 = steady::now();
    c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    auto reply = c.read_until_close(3s);
    const auto took = steady::now() - t0;
    CHECK(reply.empty());
    CHECK(took >= 250ms);
    CHECK(took < 1500ms * timing_slack());
    // The deadline closes the socket first and the session counts the 408 when its read fails after that,
    // so a scrape that races the close (on another worker) can come before the count.
    const auto m = await_metrics(proxy.port(), [](const auto& m) {
      return metric_sum(m, "dplb_rejected_requests_total{", {"code=\"408\""}) >= 1;
    });
    CHECK(metric_sum(m, "dplb_rejected_requests_total{", {"code=\"408\""}) == 1);
  }
  SECTION("an idle keep-alive connection is closed quietly") {
    http_connection c(proxy.port());
    const auto t0 = steady::now();
    auto reply = c.read_until_close(3s);
    CHECK(reply.empty());
    CHECK(steady::now() - t0 < 1500ms * timing_slack());
  }
  SECTION("an engine that does not answer in time gives 504") {
    engine.set_fault(0, R"({"stall_ms": 3000})");
    auto r = http_post_json(proxy.port(), "/v1/completions", R"({"prompt":"x","max_tokens":1})", 5s);
    CHECK(r.status == 504);
    CHECK(json::parse(r.body)["error"]["code"] == 504);
    auto m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_upstream_errors_total{", {"kind=\"timeout\""}) == 1);
    CHECK(metric_sum(m, "dplb_retries_total") == 0);  // the engine had the request: never re-sent
  }
}

TEST_CASE("beyond --max-client-connections a new connection gets a clear 503", "[reliability][limits]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--max-client-connections", "2"});
  http_connection first(proxy.port());
  http_connection second(proxy.port());
  REQUIRE(first.send(completion(1, false)).status == 200);  // both are really open and served
  REQUIRE(second.send(completion(1, false)).status == 200);
  http_connection third(proxy.port());
  auto reply = third.read_until_close(3s);
  CHECK(reply.rfind("HTTP/1.1 503", 0) == 0);
  CHECK(reply.find("--max-client-connections") != std::string::npos);
  first.close();
  auto again = await_until([&] {
    http_connection c(proxy.port());
    return c.send(completion(1, false), 2s).status;
  }, [](unsigned s) { return s == 200; });
  CHECK(again == 200);
}

TEST_CASE("hostile requests are refused and never reach an engine", "[reliability][hostile]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0"});
  const auto [name, raw, status] = GENERATE(table<std::string, std::string, std::string>({
      {"repeated Content-Length", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "400"},
      {"invalid Content-Length", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}", "400"},
      {"unknown transfer coding", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "501"},
      {"obs-fold", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", "400"},
      {"invalid header name", "GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Name: a\r\n\r\n", "400"},
      {"invalid request line", "GET /v1/models HTTP/9.9 extra\r\nHost: x\r\n\r\n", "400"},
      {"HTTP/1.0 with chunked", "POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "400"},
      {"CONNECT", "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", "405"},
      {"TRACE", "TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", "405"},
  }));
  INFO(name);
  // A well-behaved client on another connection is not disturbed.
  http_connection bystander(proxy.port());
  REQUIRE(bystander.send(completion(1, false)).status == 200);
  http_connection attacker(proxy.port());
  attacker.write_raw(raw);
  auto reply = attacker.read_until_close(3s);
  CHECK(reply.rfind("HTTP/1.1 " + status, 0) == 0);
  CHECK(reply.find("\"error\":{") != std::string::npos);
  CHECK(bystander.send(completion(1, false)).status == 200);
  CHECK(metric_sum(engine.metrics(0), "mock_requests_received_total") == 2);  // the bystander's two
}

TEST_CASE("an absolute-form target goes to the configured backend, as a path", "[reliability][hostile]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0"});
  http_connection c(proxy.port());
  auto r = c.send({bhttp::verb::get, "http://169.254.169.254/mock/echo?x=1", 11});
  REQUIRE(r.status == 200);
  auto echo = json::parse(r.body);
  CHECK(echo["target"] == "/mock/echo?x=1");
  auto own = c.send({bhttp::verb::get, "http://anything/metrics", 11});
  CHECK(own.status == 200);
  CHECK(own.body.find("dplb_requests_total") != std::string::npos);  // dplb's own path, not forwarded
}

TEST_CASE("SIGTERM: stop accepting, finish what is in flight, exit 0", "[reliability][shutdown]") {
  mock_engine engine(1, {"--itl-ms", "40"});
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--drain-timeout-ms", "10000"});
  http_connection idle(proxy.port());  // a keep-alive connection with nothing in flight
  http_response stream;
  std::thread client([&] {
    http_connection c(proxy.port());
    stream = c.send_streaming(completion(25, true), 10s);  // about one second of tokens
  });
  await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_inflight{") == 1; });
  REQUIRE(::kill(proxy.process().pid(), SIGTERM) == 0);
  // The idle connection is closed at once, and new connections are refused.
  CHECK(idle.read_until_close(2s).empty());
  const auto refused = await_until([&] {
    try {
      http_connection c(proxy.port(), 200ms);
      return false;
    } catch (const std::exception&) {
      return true;
    }
  }, [](bool r) { return r; }, 2s);
  CHECK(refused);
  client.join();
  CHECK(stream.status == 200);
  CHECK(stream.complete);  // the stream in flight finished whole
  CHECK(stream.body.find("data: [DONE]") != std::string::npos);
  CHECK(proxy.process().stop(SIGTERM, 5s) == 0);  // it exits 0 by itself once drained
}

#include "loadgen.hpp"

TEST_CASE("with --max-inflight-per-rank requests wait in dplb, FIFO, bounded in size and time", "[reliability][queue]") {
  mock_engine engine(2, {"--ttft-ms", "400"});
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--max-inflight-per-rank", "2",
                                   "--max-queued-requests", "4", "--queue-timeout-ms", "3000"});
  dplb::loadgen::run_options o;
  o.port = proxy.port();
  o.shape.stream = false;
  o.shape.input_len = 4;
  o.shape.output_len = 1;
  o.shape.model = "mock-model";
  o.timeout = 20s;

  SECTION("8 at once: 4 run, 4 wait and then run; engines never see more than 2 each") {
    o.num_prompts = 8;
    std::atomic<double> peak_inflight{0};
    std::atomic<bool> done{false};
    std::thread sampler([&] {
      while (!done) {
        auto m = scrape_metrics(proxy.port());
        for (int r = 0; r < 2; ++r) {
          const double v = metric_sum(m, "dplb_rank_inflight{", {rank_label(r)});
          if (v > peak_inflight) peak_inflight = v;
        }
        std::this_thread::sleep_for(5ms);  // sampling a gauge while the run goes on
      }
    });
    auto report = dplb::loadgen::run(o);
    done = true;
    sampler.join();
    CHECK(report.succeeded() == 8);
    std::size_t second_wave = 0;
    for (const auto& r : report.results) second_wave += r.e2e_s >= 0.75 ? 1 : 0;
    CHECK(second_wave == 4);
    CHECK(peak_inflight.load() == 2);
    auto m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_queue_wait_seconds_count") == 4);
    CHECK(metric_sum(m, "dplb_queue_depth") == 0);
  }
  SECTION("beyond the queue's size: 429 at once") {
    o.num_prompts = 12;
    auto report = dplb::loadgen::run(o);
    std::size_t ok = 0, too_many = 0;
    for (const auto& r : report.results) {
      ok += r.status == 200 ? 1 : 0;
      too_many += r.status == 429 ? 1 : 0;
    }
    CHECK(ok == 8);
    CHECK(too_many == 4);
    CHECK(metric_sum(scrape_metrics(proxy.port()), "dplb_rejected_requests_total{", {"code=\"429\""}) == 4);
  }
}

TEST_CASE("a request that waits longer than --queue-timeout-ms gets 503", "[reliability][queue]") {
  mock_engine engine(1, {"--ttft-ms", "1500"});
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--max-inflight-per-rank", "1",
                                   "--queue-timeout-ms", "200"});
  dplb::loadgen::run_options o;
  o.port = proxy.port();
  o.num_prompts = 2;
  o.shape.stream = false;
  o.shape.output_len = 1;
  o.shape.model = "mock-model";
  o.timeout = 10s;
  auto report = dplb::loadgen::run(o);
  std::vector<unsigned> statuses;
  for (const auto& r : report.results) statuses.push_back(r.status);
  std::sort(statuses.begin(), statuses.end());
  CHECK(statuses == std::vector<unsigned>{200, 503});
  auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_rejected_requests_total{", {"code=\"503\""}) == 1);
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
}

TEST_CASE("a client that leaves while queued gives up its place at once and never reaches an engine",
          "[reliability][queue][disconnect]") {
  mock_engine engine(1, {"--itl-ms", "50"});
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--max-inflight-per-rank", "1",
                                   "--queue-timeout-ms", "30000"});
  http_response first;
  std::thread streamer([&] {
    http_connection c(proxy.port());
    first = c.send_streaming(completion(40, true), 20s);  // about two seconds of tokens
  });
  auto m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_inflight{") == 1; });
  REQUIRE(metric_sum(m, "dplb_rank_inflight{") == 1);
  leave_while_queued(proxy.port());
  // The close itself ends the wait, long before the stream frees the slot; dplb answers nobody, so the
  // request is counted as rejected with nginx's 499 (it never had a rank to be counted on).
  m = await_metrics(proxy.port(), [](const auto& m) {
    return metric_sum(m, "dplb_queue_depth") == 0 &&
           metric_sum(m, "dplb_rejected_requests_total{", {"code=\"499\""}) == 1;
  });
  CHECK(metric_sum(m, "dplb_queue_depth") == 0);
  CHECK(metric_sum(m, "dplb_rejected_requests_total{", {"code=\"499\""}) == 1);
  CHECK(metric_sum(m, "dplb_rank_inflight{") == 1);  // the stream still holds the slot
  streamer.join();
  CHECK(first.status == 200);
  CHECK(first.complete);
  // A request sent after the stream ended gets the slot only after any waiter left over from before it
  // (the queue is FIFO): once it is answered, a forwarded leaver would have reached the engine already.
  const auto last = http_post_json(proxy.port(), "/v1/completions", R"({"prompt":"x","max_tokens":1})");
  CHECK(last.status == 200);
  CHECK(metric_sum(engine.metrics(0), "mock_requests_received_total") == 2);  // the stream and the last one
  m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_queue_depth") == 0);
  CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"499\""}) == 0);
}

TEST_CASE("under --max-inflight-per-rank a retry whose other ranks are full waits for a slot, first in line",
          "[reliability][queue][retry]") {
  // Rank 0 resets every request before answering; rank 1 works. A stream holds rank 1's only slot (it was
  // retried there from rank 0 itself); the next request is reset on rank 0 too, finds rank 1 full, and must
  // wait for rank 1's slot (a 502 was the answer before retries could queue).
  mock_engine engine(2, {"--itl-ms", "50"});
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--ejection-threshold", "0",
                                   "--policy", "round-robin", "--max-inflight-per-rank", "1",
                                   "--queue-timeout-ms", "30000"});
  engine.set_fault(0, R"({"reset_on_request": true})");
  http_response first;
  std::thread streamer([&] {
    http_connection c(proxy.port());
    first = c.send_streaming(completion(60, true), 30s);  // about 3 s of tokens: time to see the leaver go
  });
  auto m = await_metrics(proxy.port(), [](const auto& m) {
    return metric_sum(m, "dplb_rank_inflight{", {rank_label(1)}) == 1 && metric_sum(m, "dplb_retries_total") == 1;
  });
  REQUIRE(metric_sum(m, "dplb_rank_inflight{", {rank_label(1)}) == 1);
  SECTION("it gets the slot when the stream ends") {
    http_response second;
    std::thread retried([&] {
      http_connection c(proxy.port());
      second = c.send(completion(1, false));
    });
    m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_queue_depth") == 1; });
    CHECK(metric_sum(m, "dplb_queue_depth") == 1);  // the retry, waiting for rank 1
    CHECK(metric_sum(m, "dplb_rank_inflight{", {rank_label(0)}) == 0);  // its failed slot was given back
    retried.join();
    streamer.join();
    CHECK(first.status == 200);
    CHECK(first.complete);
    CHECK(second.status == 200);
    CHECK(header(second, "x-dplb-rank") == "1");
    m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_retries_total") == 2);
    CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"200\""}) == 2);
    CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"502\""}) == 0);
  }
  SECTION("its client leaving gives its place up at once") {
    leave_while_queued(proxy.port());
    m = await_metrics(proxy.port(), [](const auto& m) {
      return metric_sum(m, "dplb_queue_depth") == 0 && metric_sum(m, "dplb_requests_total{", {"code=\"499\""}) == 1;
    });
    CHECK(metric_sum(m, "dplb_queue_depth") == 0);
    CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"499\""}) == 1);
    CHECK(metric_sum(m, "dplb_rank_inflight{", {rank_label(1)}) == 1);  // the stream still holds it
    streamer.join();
    CHECK(first.status == 200);
    m = scrape_metrics(proxy.port());
    CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
    CHECK(metric_sum(engine.metrics(1), "mock_requests_received_total") == 1);  // the stream only
  }
  if (streamer.joinable()) streamer.join();
}

TEST_CASE("a drain that times out with requests still queued exits cleanly", "[reliability][queue][shutdown]") {
  // Requests still queued when the drain times out are torn down with their worker threads, while other
  // workers' sessions still hold slots: no freed slot may then be handed to a worker that is gone.
  mock_engine engine(1, {"--itl-ms", "50"});
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--max-inflight-per-rank", "1",
                                   "--threads", "2", "--drain-timeout-ms", "200"});
  std::vector<std::unique_ptr<http_connection>> clients;
  for (int i = 0; i < 6; ++i) {
    clients.push_back(std::make_unique<http_connection>(proxy.port()));
    clients.back()->write_raw(wire(completion(200, true)));  // ten seconds of tokens: never done in time
  }
  auto m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_queue_depth") == 5; });
  REQUIRE(metric_sum(m, "dplb_queue_depth") == 5);
  REQUIRE(::kill(proxy.process().pid(), SIGTERM) == 0);
  const auto status = proxy.process().stop(SIGTERM, 5s);
  INFO("exit status " << (status ? std::to_string(*status) : "none: still running after 5 s"));
  CHECK(status == 0);
}

TEST_CASE("timeouts while relaying: a silent engine and a client that stops reading", "[reliability][timeouts]") {
  SECTION("an engine silent mid-stream for longer than --upstream-read-timeout-ms is cut; the client sees the truncation") {
    mock_engine engine(1, {"--itl-ms", "2000"});  // the second token would come 2 s after the first
    dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--upstream-read-timeout-ms", "200"});
    http_connection client(proxy.port());
    const auto t0 = steady::now();
    const auto r = client.send_streaming(completion(5, true), 10s);
    const auto took = steady::now() - t0;
    CHECK(r.status == 200);
    CHECK_FALSE(r.complete);  // no terminating chunk: the client knows the response is incomplete
    CHECK(r.body.find("data: ") != std::string::npos);  // the first token did arrive
    CHECK(took >= 180ms);
    CHECK(took < 1500ms * timing_slack());  // long before the engine's next token
    const auto m = await_metrics(proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_inflight{") == 0; });
    CHECK(metric_sum(m, "dplb_rank_inflight{") == 0);
    CHECK(metric_sum(m, "dplb_upstream_errors_total{", {"kind=\"midstream\""}) == 1);
  }
  SECTION("a client that stops reading is dropped after --client-write-timeout-ms, and the engine sees the abort") {
    mock_engine engine(1);
    dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--client-write-timeout-ms", "300"});
    http_connection client(proxy.port());
    // 64 MiB of events, far more than the socket buffers between dplb and a client that reads nothing.
    client.write_raw("GET /mock/stream?events=8192&interval_ms=0&bytes=8192 HTTP/1.1\r\nHost: x\r\n\r\n");
    const auto gone = await_metrics(proxy.port(), [](const auto& m) {
      return metric_sum(m, "dplb_requests_total{", {"code=\"499\""}) == 1 && metric_sum(m, "dplb_rank_inflight{") == 0;
    }, 5s);
    CHECK(metric_sum(gone, "dplb_requests_total{", {"code=\"499\""}) == 1);
    CHECK(metric_sum(gone, "dplb_rank_inflight{") == 0);
    const auto e = await_until([&] { return engine.metrics(0); },
                               [](const auto& e) { return metric_sum(e, "mock_requests_aborted_total") == 1; });
    CHECK(metric_sum(e, "mock_requests_aborted_total") == 1);
  }
  SECTION("a client that reads for a while and then stalls is dropped in time, however far the read deadline is") {
    // The relay waits on the engine most of the time, whose deadline (the default 600 s) is far away; the
    // write deadline set when the client stalls must still be enforced within about one write timeout.
    mock_engine engine(1);
    dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0", "--client-write-timeout-ms", "300"});
    http_connection client(proxy.port());
    client.write_raw("GET /mock/stream?events=100000&interval_ms=5&bytes=65536 HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(client.read_for(1200ms) > 0);  // several watchdog periods of a healthy stream
    const auto stalled_at = steady::now();
    const auto gone = await_metrics(proxy.port(), [](const auto& m) {
      return metric_sum(m, "dplb_requests_total{", {"code=\"499\""}) == 1;
    }, 15s);
    CHECK(metric_sum(gone, "dplb_requests_total{", {"code=\"499\""}) == 1);
    CHECK(steady::now() - stalled_at < 10s * timing_slack());  // socket buffers filling, then 300 ms
    CHECK(client.is_open());  // dplb dropped the client; the client never closed
  }
}
