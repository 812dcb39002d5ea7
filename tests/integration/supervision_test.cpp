// No silent death: every background task of dplb (the accept loop, the admin API's accept loop, the health
// checks, the engine-stats reads, the upstream pool's sweep, the access log's writer) is made to throw once
// by the test hook DPLB_TEST_THROW_ONCE, and each is then seen logged with its name, counted in
// dplb_internal_errors_total{task}, and doing its work again.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "await.hpp"
#include "free_ports.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "temp_file.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> every_task{"accept", "admin_accept", "health", "engine_stats", "pool_sweep",
                                          "access_log"};
const std::string token = "supervision-test-token-51c2";

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

// Sets an environment variable for the child processes started while it lives (this test's process only).
class scoped_environment {
 public:
  scoped_environment(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~scoped_environment() { ::unsetenv(name_); }
  scoped_environment(const scoped_environment&) = delete;
  scoped_environment& operator=(const scoped_environment&) = delete;

 private:
  const char* name_;
};

std::chrono::milliseconds slack(std::chrono::milliseconds bound) {
  return std::chrono::milliseconds(static_cast<long>(static_cast<double>(bound.count()) * timing_slack()));
}

double errors_of(const std::map<std::string, double>& metrics, const std::string& task) {
  const auto it = metrics.find("dplb_internal_errors_total{task=\"" + task + "\"}");
  return it == metrics.end() ? -1 : it->second;
}

std::vector<json> access_lines(const std::string& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

}  // namespace

TEST_CASE("every background task that throws is logged, counted and working again", "[supervision]") {
  temp_file token_file(token + "\n");
  temp_file access_log;
  // The engine keeps an idle connection for a minute: only dplb's pool sweep closes one sooner.
  mock_engine engine(2, {"--keepalive-timeout-ms", "60000"});
  std::optional<dplb_proxy> started;
  {
    scoped_environment faults("DPLB_TEST_THROW_ONCE", joined(every_task));
    started.emplace(engine.urls(),
                    std::vector<std::string>{"--policy", "round-robin", "--threads", "1",
                                             "--admin-listen", "127.0.0.1:0", "--admin-token-file", token_file.path(),
                                             "--access-log", access_log.path(), "--stats-interval", "100",
                                             "--health-check-interval-ms", "100", "--unhealthy-threshold", "2",
                                             "--upstream-idle-timeout-ms", "300"});
  }
  auto& proxy = *started;

  // Logged: one error line per task, naming it, each saying that it restarts.
  std::set<std::string> logged;
  const std::regex failure(R"(internal error in task (\w+): fault injected by the test hook .*; restarting it in \d+ ms)");
  while (logged.size() < every_task.size()) {
    const auto line = proxy.process().wait_for_line(failure, slack(5s));
    if (!line) break;
    logged.insert((*line)[1]);
  }
  CHECK(logged == std::set<std::string>(every_task.begin(), every_task.end()));

  // Counted, once each, and served on the public port: the accept loop accepts again.
  const auto counted = await_metrics(
      proxy.port(),
      [](const auto& m) {
        return std::ranges::all_of(every_task, [&](const std::string& t) { return errors_of(m, t) == 1; });
      },
      slack(5s));
  for (const auto& t : every_task) {
    INFO("task " << t);
    CHECK(errors_of(counted, t) == 1);
  }
  INFO(proxy.process().output());

  // accept: a new client connection is served, end to end.
  const auto answered = http_post_json(proxy.port(), "/v1/completions",
                                       R"({"model":"mock-model","prompt":"w1 w2","max_tokens":2})");
  REQUIRE(answered.status == 200);

  // admin_accept: the admin API answers on a new connection.
  http_connection admin(proxy.admin_port());
  bhttp::request<bhttp::string_body> ranks{bhttp::verb::get, "/ranks", 11};
  ranks.set(bhttp::field::authorization, "Bearer " + token);
  CHECK(admin.send(ranks).status == 200);

  // access_log: the request's line is written.
  const auto lines = await_until([&] { return access_lines(access_log.path()); },
                                 [](const std::vector<json>& l) { return !l.empty(); }, slack(5s));
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["status"] == 200);

  // pool_sweep: the request left an idle connection to its rank in the pool; the sweep closes it once it
  // has been idle for 300 ms (the engine would keep it for a minute).
  const auto rank = static_cast<std::size_t>(lines[0]["rank"].get<int>());
  const auto swept = await_until([&] { return engine.metrics(rank); },
                                 [](const auto& m) { return metric_sum(m, "mock_connections_open") == 0; }, slack(3s));
  CHECK(metric_sum(swept, "mock_connections_open") == 0);
  CHECK(metric_sum(swept, "mock_connections_accepted_total") >= 1);

  // engine_stats: a number the engine reports now reaches dplb's metrics.
  engine.override_metrics(0, 0, R"({"running":7})");
  const auto read = await_metrics(
      proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_engine_running{", {"rank=\"0\""}) == 7; }, slack(5s));
  CHECK(metric_sum(read, "dplb_engine_running{", {"rank=\"0\""}) == 7);

  // health: a rank whose checks fail is marked down, and up again once they pass.
  engine.set_fault(1, R"({"health_status":503})");
  const auto down = await_metrics(
      proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_healthy{", {"rank=\"1\""}) == 0; }, slack(5s));
  CHECK(metric_sum(down, "dplb_rank_healthy{", {"rank=\"1\""}) == 0);
  engine.clear_fault(1);
  const auto up = await_metrics(
      proxy.port(), [](const auto& m) { return metric_sum(m, "dplb_rank_healthy{", {"rank=\"1\""}) == 1; }, slack(5s));
  CHECK(metric_sum(up, "dplb_rank_healthy{", {"rank=\"1\""}) == 1);

  // Each failed once only: nothing else went wrong meanwhile.
  const auto after = scrape_metrics(proxy.port());
  for (const auto& t : every_task) {
    INFO("task " << t);
    CHECK(errors_of(after, t) == 1);
  }
}

TEST_CASE("every task's error counter is exported at 0 from the start", "[supervision]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls());
  const auto metrics = scrape_metrics(proxy.port());
  for (const auto& t : every_task) {
    INFO("task " << t);
    CHECK(errors_of(metrics, t) == 0);
  }
  CHECK(errors_of(metrics, "kv_events") == 0);
}

TEST_CASE("the KV-cache events subscriber that throws is logged, counted and reading again", "[supervision][kv-events]") {
  // (apart from the test above: the subscriber runs only with a prefix-aware cluster or a backend with events)
  const auto events_port = free_port_range(1);
  mock_engine engine(1, {"--simulate", "--time-scale", "100", "--kv-events-port", std::to_string(events_port)});
  std::optional<dplb_proxy> started;
  {
    scoped_environment faults("DPLB_TEST_THROW_ONCE", "kv_events");
    started.emplace(std::vector<std::string>{engine.urls()[0] + "#kv-events=tcp://127.0.0.1:" + std::to_string(events_port)},
                    std::vector<std::string>{"--policy", "prefix-aware"});
  }
  auto& proxy = *started;
  const std::regex failure(R"(internal error in task kv_events: fault injected by the test hook .*; restarting it in \d+ ms)");
  CHECK(proxy.process().wait_for_line(failure, slack(5s)));
  // Reading again: what the engine caches reaches dplb's index (a new prompt each time: until dplb's socket
  // has joined, the engine's events are lost, and a cached prompt stores nothing again).
  int prompt = 0;
  const auto stored = await_until(
      [&] {
        ++prompt;
        const std::string ids = "[" + std::to_string(prompt) + ",2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]";
        REQUIRE(http_post_json(engine.ports()[0], "/v1/completions",
                               R"({"model":"mock-model","max_tokens":1,"prompt":)" + ids + "}")
                    .status == 200);
        return scrape_metrics(proxy.port());
      },
      [](const auto& m) { return metric_sum(m, "dplb_kv_blocks{", {"rank=\"0\""}) >= 1; }, slack(5s));
  CHECK(metric_sum(stored, "dplb_kv_blocks{", {"rank=\"0\""}) >= 1);
  CHECK(errors_of(stored, "kv_events") == 1);
}

TEST_CASE("a name in DPLB_TEST_THROW_ONCE that is no task's stops dplb at start-up", "[supervision]") {
  mock_engine engine(1);
  scoped_environment faults("DPLB_TEST_THROW_ONCE", "accept,acept");
  child_process dplb(dplb_binary(), {"--listen", "127.0.0.1:0", "--backend", engine.urls()[0]});
  CHECK(dplb.wait_for_line(std::regex("DPLB_TEST_THROW_ONCE: 'acept' is no task's name"), slack(5s)));
  const auto status = dplb.stop(0, slack(5s));  // signal 0: none sent, only the exit awaited
  INFO(dplb.output());
  REQUIRE(status.has_value());
  CHECK(*status == 2);
}
