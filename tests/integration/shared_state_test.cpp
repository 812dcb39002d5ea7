// Several dplb replicas in front of the same ranks share one ledger in a real redis-server
// (--shared-state): a burst split between them lands as exactly as through one; without Redis, or with it
// paused, every request is still served, by each replica's own counts.

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "loadgen.hpp"
#include "processes.hpp"
#include "raw_engine.hpp"
#include "redis_server.hpp"
#include "temp_file.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using namespace std::chrono_literals;

namespace {

std::string redis_url(std::uint16_t port) { return "redis://127.0.0.1:" + std::to_string(port); }

// A replica of the shared ledger. The pick timeout is raised from its default (20 ms) so that a loaded test
// machine (sanitizers) never turns a pick into a local one: these tests are about exactness.
std::vector<std::string> replica_args(std::uint16_t redis_port, const std::string& name, const std::string& policy) {
  const auto timeout_ms = std::to_string(static_cast<int>(500 * timing_slack()));
  return {"--shared-state", redis_url(redis_port), "--replica-name", name,   "--policy",
          policy,           "--threads",            "2",             "--shared-state-timeout-ms", timeout_ms};
}

bool shared_state_up(std::uint16_t port) {
  return metric_sum(await_metrics(port, [](const auto& m) { return metric_sum(m, "dplb_shared_state_up") == 1; },
                                  10s),
                    "dplb_shared_state_up") == 1;
}

dplb::loadgen::run_options burst_of(std::size_t requests, std::uint16_t port) {
  dplb::loadgen::run_options o;
  o.port = port;
  o.num_prompts = requests;  // every request at t=0, one connection each
  o.shape.input_len = 8;
  o.shape.output_len = 4;
  o.shape.model = "mock-model";
  o.timeout = 60s;
  return o;
}

}  // namespace

TEST_CASE("a burst split between two replicas that share a ledger lands exactly on every rank", "[shared-state]") {
  // least-load reads the engines' /metrics every 100 ms during the burst: the reads must not disturb it.
  const auto policy = GENERATE(as<std::string>{}, "least-inflight", "round-robin", "least-load");
  const std::size_t through_a = GENERATE(129u, 200u);
  const std::size_t through_b = 256 - through_a;
  INFO(policy << ": " << through_a << " requests through replica a, " << through_b << " through b");
  redis_server redis;
  // A second to the first token: the whole burst is in flight at once.
  const auto ttft_ms = std::to_string(static_cast<int>(1000 * timing_slack()));
  mock_engine engine(4, {"--ttft-ms", ttft_ms, "--itl-ms", "5"});
  dplb_proxy a(engine.urls(), replica_args(redis.port(), "a", policy));
  dplb_proxy b(engine.urls(), replica_args(redis.port(), "b", policy));
  REQUIRE(shared_state_up(a.port()));
  REQUIRE(shared_state_up(b.port()));

  dplb::loadgen::run_report report_a, report_b;
  std::thread client_b([&] { report_b = dplb::loadgen::run(burst_of(through_b, b.port())); });
  report_a = dplb::loadgen::run(burst_of(through_a, a.port()));
  client_b.join();
  INFO(report_a.error << report_b.error);
  REQUIRE(report_a.succeeded() == through_a);
  REQUIRE(report_b.succeeded() == through_b);
  REQUIRE(dplb::loadgen::summarize(report_a).peak_concurrency == through_a);  // each really was a burst
  REQUIRE(dplb::loadgen::summarize(report_b).peak_concurrency == through_b);

  // What each engine served, whichever replica sent it: 64 each. Alone, each replica would have spread
  // its own share, e.g. 129 as 33/32/32/32 and 127 as 32/32/32/31 (or 33/32/32/31 with the rotations
  // starting on the same rank): 65/64/64/63.
  for (std::size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(metric_sum(scrape_metrics(engine.ports()[rank]), "vllm:request_success_total") == 64);
  }
  const auto m = scrape_metrics(a.port());
  CHECK(metric_sum(m, "dplb_shared_state_replicas") == 2);
  CHECK(metric_sum(m, "dplb_shared_state_pick_seconds_count") >= static_cast<double>(through_a));
  CHECK(metric_sum(m, "dplb_shared_state_errors_total{", {"op=\"pick\""}) == 0);
}

// A loopback port bound and never listened on: a connection to it is refused, and no other test's server
// can take it meanwhile (as one could a free port that nobody holds).
class refused_port {
 public:
  refused_port() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof addr;
    REQUIRE(fd_ >= 0);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &size) == 0);
    port_ = ntohs(addr.sin_port);
  }
  ~refused_port() { ::close(fd_); }
  refused_port(const refused_port&) = delete;
  refused_port& operator=(const refused_port&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  int fd_;
  std::uint16_t port_ = 0;
};

TEST_CASE("without a Redis that answers, a replica starts and serves by its own counts", "[shared-state]") {
  const refused_port nothing_there_holder;
  const auto nothing_there = nothing_there_holder.port();
  mock_engine engine(4);
  dplb_proxy proxy(engine.urls(), {"--shared-state", redis_url(nothing_there), "--policy", "round-robin"});
  auto report = dplb::loadgen::run(burst_of(8, proxy.port()));
  INFO(report.error);
  REQUIRE(report.succeeded() == 8);
  for (const auto& [rank, count] : report.rank_counts()) CHECK(count == 2);
  const auto m = await_metrics(proxy.port(), [](const auto& s) {
    return metric_sum(s, "dplb_shared_state_errors_total{", {"op=\"connect\""}) > 0;
  });
  CHECK(metric_sum(m, "dplb_shared_state_up") == 0);
  CHECK(metric_sum(m, "dplb_shared_state_errors_total{", {"op=\"connect\""}) > 0);
  CHECK(metric_sum(m, "dplb_shared_state_pick_seconds_count") == 0);  // no pick waited for it
}

TEST_CASE("a shared state URL with another scheme exits 2 with one line naming --shared-state, never the password",
          "[shared-state]") {
  mock_engine engine(1);
  child_process dplb(dplb_binary(), {"--listen", "127.0.0.1:0", "--backend", engine.urls()[0], "--shared-state",
                                     "http://admin:s3cret-word@127.0.0.1:6379"});
  CHECK(dplb.wait_for_line(std::regex("--shared-state.*redis://"), 10s).has_value());
  CHECK_FALSE(await_until([&] { return dplb.running(); }, [](bool running) { return !running; }, 10s));
  CHECK(dplb.stop(SIGTERM) == 2);
  CHECK(dplb.output().find("s3cret-word") == std::string::npos);
}

TEST_CASE("Redis paused: every request is still served, and once resumed the replica is up again", "[shared-state]") {
  redis_server redis;
  mock_engine engine(4);
  dplb_proxy proxy(engine.urls(),
                   {"--shared-state", redis_url(redis.port()), "--shared-state-timeout-ms", "50", "--threads", "2"});
  REQUIRE(shared_state_up(proxy.port()));
  REQUIRE(::kill(redis.pid(), SIGSTOP) == 0);
  struct resumed_at_exit {  // whatever fails below, Redis is not left stopped (its teardown would wait)
    pid_t pid;
    ~resumed_at_exit() { ::kill(pid, SIGCONT); }
  } resume{redis.pid()};
  // Each request waits for one pick at most (50 ms), then goes by the replica's own counts.
  auto report = dplb::loadgen::run(burst_of(16, proxy.port()));
  const auto paused = scrape_metrics(proxy.port());
  REQUIRE(::kill(redis.pid(), SIGCONT) == 0);
  INFO(report.error);
  CHECK(report.succeeded() == 16);
  CHECK(metric_sum(paused, "dplb_shared_state_errors_total{", {"op=\"pick\""}) >= 1);
  // Back within 5 s of Redis's return (its reconnect backoff is at most 1 s).
  CHECK(shared_state_up(proxy.port()));
}

TEST_CASE("a replica that dies leaves the ledger within 5 s", "[shared-state]") {
  redis_server redis;
  mock_engine engine(2);
  dplb_proxy a(engine.urls(), replica_args(redis.port(), "a", "least-inflight"));
  dplb_proxy b(engine.urls(), replica_args(redis.port(), "b", "least-inflight"));
  REQUIRE(shared_state_up(a.port()));
  REQUIRE(shared_state_up(b.port()));
  CHECK(metric_sum(await_metrics(b.port(),
                                 [](const auto& m) { return metric_sum(m, "dplb_shared_state_replicas") == 2; }),
                   "dplb_shared_state_replicas") == 2);
  const auto killed_at = std::chrono::steady_clock::now();
  a.process().stop(SIGKILL);
  const auto m = await_metrics(b.port(), [](const auto& s) { return metric_sum(s, "dplb_shared_state_replicas") == 1; },
                               10s);
  CHECK(metric_sum(m, "dplb_shared_state_replicas") == 1);
  // Its lease (3 s) ran out, and b's view (every second) saw it.
  CHECK(std::chrono::steady_clock::now() - killed_at < scaled(5s));
}

TEST_CASE("a per-rank limit (--max-inflight-per-rank) bounds every rank's requests over the replicas together",
          "[shared-state][queue]") {
  redis_server redis;
  const auto ttft_ms = std::to_string(static_cast<int>(300 * timing_slack()));
  mock_engine engine(2, {"--ttft-ms", ttft_ms, "--itl-ms", "5"});
  auto args = [&](const std::string& name) {
    auto a = replica_args(redis.port(), name, "least-inflight");
    a.insert(a.end(), {"--max-inflight-per-rank", "2", "--queue-timeout-ms", "60000"});
    return a;
  };
  dplb_proxy a(engine.urls(), args("a"));
  dplb_proxy b(engine.urls(), args("b"));
  REQUIRE(shared_state_up(a.port()));
  REQUIRE(shared_state_up(b.port()));

  // What each engine holds, sampled while 12 requests come through each replica: 4 slots in all, so 24
  // requests wait their turn in six waves. Alone, each replica would allow 2 per rank of its own: 4 per rank.
  std::atomic<bool> done{false};
  std::vector<double> most(2, 0);
  std::thread sampler([&] {
    while (!done.load()) {
      for (std::size_t rank = 0; rank < 2; ++rank) {
        const auto m = scrape_metrics(engine.ports()[rank]);
        most[rank] = std::max(most[rank], metric_sum(m, "vllm:num_requests_running") +
                                              metric_sum(m, "vllm:num_requests_waiting"));
      }
    }
  });
  dplb::loadgen::run_report report_a, report_b;
  std::thread client_b([&] { report_b = dplb::loadgen::run(burst_of(12, b.port())); });
  report_a = dplb::loadgen::run(burst_of(12, a.port()));
  client_b.join();
  done = true;
  sampler.join();
  INFO(report_a.error << report_b.error);
  CHECK(report_a.succeeded() == 12);
  CHECK(report_b.succeeded() == 12);
  for (std::size_t rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(most[rank] == 2);  // reached, never passed
    CHECK(metric_sum(scrape_metrics(engine.ports()[rank]), "vllm:request_success_total") == 12);
  }
}

namespace {

// A completion of tenant `tenant` (named by X-Team) through the replica on `port`.
http_response tenant_request(std::uint16_t port, const std::string& tenant, int max_tokens) {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::host, "dplb");
  r.set(bhttp::field::content_type, "application/json");
  r.set("X-Team", tenant);
  r.body() = nlohmann::json{{"model", "mock-model"}, {"prompt", "x"}, {"max_tokens", max_tokens}}.dump();
  r.prepare_payload();
  http_connection c(port);
  return c.send(r);
}

}  // namespace

TEST_CASE("a tenant's requests_per_second and tokens_per_minute hold over the replicas together",
          "[shared-state][tenants]") {
  // "rate": 4 requests deep, one more every 100 s. "budget": 600 tokens a minute; a request reserves its
  // prompt (1 token) and max_tokens, and the engine reports 50 used.
  temp_file config(nlohmann::json{{"tenants", nlohmann::json::array({
                                                  {{"name", "rate"}, {"requests_per_second", 0.01}, {"burst", 4}},
                                                  {{"name", "budget"}, {"tokens_per_minute", 600}},
                                              })}}
                       .dump());
  const std::string body = R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x"}],)"
                           R"("usage":{"prompt_tokens":10,"completion_tokens":40,"total_tokens":50}})";
  raw_engine engine([&](const raw_request&) {
    return std::vector{write_bytes("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n" + body)};
  });
  redis_server redis;
  auto args = [&](const std::string& name) {
    auto a = replica_args(redis.port(), name, "least-inflight");
    a.insert(a.end(), {"--config", config.path(), "--tenant-header", "X-Team", "--health-check-interval-ms", "0"});
    return a;
  };
  dplb_proxy a({engine.url()}, args("a"));
  dplb_proxy b({engine.url()}, args("b"));
  REQUIRE(shared_state_up(a.port()));
  REQUIRE(shared_state_up(b.port()));

  // `n` requests of the tenant, alternating between the replicas: how many were admitted. Each refusal is a 429
  // naming `limit`, its Retry-After within [earliest, latest] seconds.
  const auto admitted_of = [&](const std::string& tenant, int max_tokens, int n, const std::string& limit,
                               int earliest, int latest) {
    int admitted = 0;
    for (int i = 0; i < n; ++i) {
      const auto answer = tenant_request(i % 2 ? b.port() : a.port(), tenant, max_tokens);
      if (answer.status == 200) {
        ++admitted;
        continue;
      }
      INFO(answer.body);
      CHECK(answer.status == 429);
      CHECK_THAT(answer.body, Catch::Contains(limit));
      CHECK(std::stoi(std::string(answer.headers["retry-after"])) >= earliest);
      CHECK(std::stoi(std::string(answer.headers["retry-after"])) <= latest);
    }
    return admitted;
  };
  // 4 requests in all, not 4 through each (one more comes back every 100 s).
  CHECK(admitted_of("rate", 1, 10, "requests_per_second", 1, 100) == 4);
  // 600 tokens: each request reserves 241 and uses 50, the rest given back to the shared budget. So 8 fit
  // (600 - 7 x 50 = 250 still holds 241; then 200 does not), through both replicas together; not 8 through
  // each (16), nor 2 had the unused tokens not come back. A refusal waits for ~41 tokens at 10 a second, less
  // the time the requests took (a slow machine's).
  CHECK(admitted_of("budget", 240, 20, "tokens_per_minute", 1, 6) == 8);
  // The whole budget is still refused for good by the replica itself (400, no Retry-After).
  const auto too_large = tenant_request(b.port(), "budget", 700);
  CHECK(too_large.status == 400);
  CHECK(too_large.headers.count("retry-after") == 0);
  CHECK(engine.request_count() == 12);
  double counted = 0;
  for (const auto port : {a.port(), b.port()}) {
    counted += metric_sum(scrape_metrics(port), "dplb_tenant_requests_total{", {"tenant=\"rate\"", "code=\"429\""});
  }
  CHECK(counted == 6);

  // Redis gone: each replica limits by its own buckets (full again), and nothing fails for want of Redis.
  redis.stop();
  const auto down = await_metrics(a.port(), [](const auto& m) { return metric_sum(m, "dplb_shared_state_up") == 0; }, 10s);
  REQUIRE(metric_sum(down, "dplb_shared_state_up") == 0);
  int alone = 0;
  for (int i = 0; i < 6; ++i) alone += tenant_request(a.port(), "rate", 1).status == 200 ? 1 : 0;
  CHECK(alone == 4);
}
