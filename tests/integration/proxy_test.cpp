// The proxy's behaviour on the wire: the real dplb in front of the mock engine.

#include <catch2/catch.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

bhttp::request<bhttp::string_body> post_json(const std::string& target, const json& body) {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, target, 11};
  r.set(bhttp::field::content_type, "application/json");
  r.body() = body.dump();
  return r;
}

json completion_body(int max_tokens, bool stream, const std::string& prompt = "a b c") {
  json body{{"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", stream}};
  if (stream) body["stream_options"] = {{"include_usage", true}};
  return body;
}

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}


std::string header(const http_response& r, std::string_view name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? std::string() : std::string(it->value());
}

}  // namespace

TEST_CASE("dplb answers its own /health and /metrics", "[proxy]") {
  mock_engine engine(2);
  // Active health checks off: this test counts every request that reaches the engine.
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0"});
  auto health = http_get(proxy.port(), "/health");
  CHECK(health.status == 200);
  CHECK(health.body.empty());
  auto metrics = http_get(proxy.port(), "/metrics");
  CHECK(metrics.status == 200);
  CHECK(header(metrics, "content-type").find("text/plain; version=0.0.4") == 0);
  CHECK(metrics.body.find("dplb_rank_inflight{rank=\"1\",url=\"" + engine.urls()[1] + "\"} 0") != std::string::npos);
  // Neither request reached an engine.
  auto engine_metrics = scrape_metrics(engine.ports()[0]);
  CHECK(metric_sum(engine_metrics, "mock_requests_received_total") == 0);
}

TEST_CASE("a client connection is kept alive and upstream connections are reused", "[proxy]") {
  mock_engine engine(1);
  // Active health checks off: this test counts every request and connection that reaches the engine.
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0"});
  http_connection client(proxy.port());
  for (int i = 0; i < 10; ++i) {
    auto r = client.send(post_json("/v1/completions", completion_body(2, false)));
    REQUIRE(r.error.empty());
    REQUIRE(r.status == 200);
    CHECK(r.keep_alive);
    CHECK(header(r, "x-dplb-rank") == "0");
  }
  auto engine_metrics = scrape_metrics(engine.ports()[0]);
  CHECK(metric_sum(engine_metrics, "mock_requests_received_total") == 10);
  // dplb's one upstream connection, plus the connection of this scrape itself.
  CHECK(metric_sum(engine_metrics, "mock_connections_accepted_total") == 2);
  auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_upstream_connections_total") == 1);
}

TEST_CASE("a pooled connection the engine closed is replaced and the request re-sent", "[proxy]") {
  // The engine drops every second request on a connection without answering: the keep-alive race.
  mock_engine engine(1, {"--close-on-request", "2"});
  dplb_proxy proxy(engine.urls());
  http_connection client(proxy.port());
  for (int i = 0; i < 6; ++i) {
    auto r = client.send(post_json("/v1/completions", completion_body(2, false)));
    INFO("request " << i << ": " << r.error);
    REQUIRE(r.status == 200);
  }
  auto m = scrape_metrics(proxy.port());
  // Requests 2..6 each found their pooled connection closed, were re-sent once and succeeded.
  CHECK(metric_sum(m, "dplb_upstream_keepalive_retries_total") == 5);
  CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"200\""}) == 6);
  CHECK(metric_sum(m, "dplb_requests_total{", {"code=\"502\""}) == 0);
}

TEST_CASE("hop-by-hop headers are stripped and forwarding headers added", "[proxy]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls());
  http_connection client(proxy.port());
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/mock/echo?x=1", 11};
  r.set(bhttp::field::connection, "keep-alive, X-Hop-Secret");
  r.set("X-Hop-Secret", "must-not-pass");
  r.set(bhttp::field::keep_alive, "timeout=5");
  r.set(bhttp::field::te, "trailers");
  r.set(bhttp::field::proxy_authorization, "Basic c2VjcmV0");
  r.set("X-Forwarded-For", "10.1.2.3");
  r.set("X-End-To-End", "kept");
  r.body() = "hello";
  auto response = client.send(r);
  REQUIRE(response.status == 200);
  CHECK(header(response, "x-dplb-rank") == "0");
  auto echo = json::parse(response.body);
  std::map<std::string, std::string> seen;
  for (const auto& h : echo["headers"]) {
    std::string name = h[0];
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    seen[name] = h[1];
  }
  CHECK(echo["target"] == "/mock/echo?x=1");
  CHECK(seen.count("x-hop-secret") == 0);
  CHECK(seen.count("keep-alive") == 0);
  CHECK(seen.count("te") == 0);
  CHECK(seen.count("proxy-authorization") == 0);
  CHECK(seen["x-end-to-end"] == "kept");
  CHECK(seen["x-forwarded-for"] == "10.1.2.3, 127.0.0.1");
  CHECK(seen["x-forwarded-proto"] == "http");
  CHECK(seen["host"] == "127.0.0.1:" + std::to_string(engine.ports()[0]));
  CHECK(echo["body_size"] == 5);
}

TEST_CASE("a 4 MiB body crosses intact with Content-Length and chunked", "[proxy]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls());
  const auto body = random_bytes(4u << 20, 7);
  const bool chunked = GENERATE(false, true);
  http_connection client(proxy.port());

  bhttp::request<bhttp::string_body> to_echo{bhttp::verb::post, "/mock/echo", 11};
  to_echo.set(bhttp::field::content_type, "application/octet-stream");
  to_echo.body() = body;
  if (chunked) to_echo.chunked(true); else to_echo.prepare_payload();
  auto echoed = client.send(to_echo);
  INFO("chunked request: " << chunked << " " << echoed.error);
  REQUIRE(echoed.status == 200);
  auto echo = json::parse(echoed.body);
  CHECK(echo["body_size"] == body.size());
  CHECK(echo["body_fnv1a64"] == fnv1a64_hex(body));

  // And the other way: a 4 MiB response body relayed unchanged.
  bhttp::request<bhttp::string_body> round_trip{bhttp::verb::post, "/mock/echo-body", 11};
  round_trip.body() = body;
  if (chunked) round_trip.chunked(true); else round_trip.prepare_payload();
  auto back = client.send(round_trip);
  REQUIRE(back.status == 200);
  CHECK(back.body.size() == body.size());
  CHECK(back.body == body);
}

TEST_CASE("ambiguous request framing is refused before any engine sees it", "[proxy]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--health-check-interval-ms", "0"});  // count only proxied requests
  http_connection client(proxy.port());
  client.write_raw(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
      "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto reply = client.read_until_close(5s);
  CHECK(reply.rfind("HTTP/1.1 400", 0) == 0);
  CHECK(reply.find("\"error\":{\"message\":") != std::string::npos);
  CHECK(reply.find("\"code\":400") != std::string::npos);
  auto engine_metrics = scrape_metrics(engine.ports()[0]);
  CHECK(metric_sum(engine_metrics, "mock_requests_received_total") == 0);
}

TEST_CASE("stream events pass through one by one, as fast as direct", "[proxy][streaming]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls());
  const int events = 25;
  const int interval_ms = 20;
  const std::string target = "/mock/stream?events=" + std::to_string(events) + "&interval_ms=" + std::to_string(interval_ms);

  // The latency of each event: its arrival at the client minus the engine's timestamp of its write
  // (both read CLOCK_MONOTONIC on this machine).
  auto latencies_us = [&](std::uint16_t port, std::vector<double>& gaps_ms) {
    http_connection c(port);
    auto r = c.send_streaming({bhttp::verb::get, target, 11}, 10s);
    REQUIRE(r.status == 200);
    REQUIRE(r.complete);
    std::vector<double> out;
    std::optional<steady::time_point> previous;
    int events_sharing = 0;  // events that arrived in a piece with another
    for (const auto& [arrived, piece] : r.pieces) {
      const double arrived_us =
          std::chrono::duration<double, std::micro>(arrived.time_since_epoch()).count();
      int in_piece = 0;
      for (auto pos = piece.find("\"t_us\":"); pos != std::string::npos; pos = piece.find("\"t_us\":", pos + 1)) {
        out.push_back(arrived_us - std::stod(piece.substr(pos + 7)));
        ++in_piece;
      }
      if (in_piece == 0) continue;  // the [DONE] event
      if (in_piece > 1) events_sharing += in_piece;
      if (previous) gaps_ms.push_back(std::chrono::duration<double, std::milli>(arrived - *previous).count());
      previous = arrived;
    }
    REQUIRE(out.size() == static_cast<std::size_t>(events));
    // One timed event per piece: a proxy that buffered would deliver most of them several together. A client
    // descheduled for an interval on a busy machine reads two at once whatever it reads from (direct too),
    // so two pieces may hold two each. (The last event may share a piece with [DONE]: the engine writes
    // those two together, and dplb relays at once whatever arrived together.)
    CHECK(events_sharing <= 4);
    return out;
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Five streams each way, alternating; the medians are compared so that one scheduling hiccup on a
  // busy machine does not decide the result.
  std::vector<double> direct_first, proxied_first, direct_all, proxied_all, direct_gaps, proxied_gaps;
  for (int run = 0; run < 5; ++run) {
    const auto direct = latencies_us(engine.ports()[0], direct_gaps);
    const auto proxied = latencies_us(proxy.port(), proxied_gaps);
    direct_first.push_back(direct.front());
    proxied_first.push_back(proxied.front());
    direct_all.insert(direct_all.end(), direct.begin(), direct.end());
    proxied_all.insert(proxied_all.end(), proxied.begin(), proxied.end());
  }
  const double added_first_ms = (median(proxied_first) - median(direct_first)) / 1000.0;
  const double added_median_ms = (median(proxied_all) - median(direct_all)) / 1000.0;
  WARN("first event (median of 5): direct " << median(direct_first) / 1000.0 << " ms, via dplb "
                                            << median(proxied_first) / 1000.0
                                            << " ms; median event latency added by dplb " << added_median_ms << " ms");
  CHECK(added_first_ms < 5.0 * timing_slack());
  CHECK(added_median_ms < 5.0 * timing_slack());
  // Gaps preserved: each inter-event gap through dplb stays close to the engine's interval.
  REQUIRE(proxied_gaps.size() >= 5 * (events - 1) / 2);
  CHECK(median(proxied_gaps) == Approx(interval_ms).margin(3.0 * timing_slack()));
  // And none far off, but for a hiccup or two of a busy machine's scheduler (a client descheduled for 40 ms
  // sees one gap of 60): a proxy that held events back would stretch many.
  const auto stretched = std::count_if(proxied_gaps.begin(), proxied_gaps.end(),
                                       [&](double gap) { return gap >= interval_ms * 3 * timing_slack(); });
  CHECK(stretched <= 2);
}
