// The admin API against the real dplb and the mock engine: the bearer token, the status page and Basic
// credentials over real HTTP (headers included), GET /ranks for a #dp=2 backend and its per-rank error
// counts, drains (a drained rank takes nothing new but finishes what it has; undrained, it takes
// requests again), runtime weights, and that the public port never serves the admin paths.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "redis_server.hpp"
#include "temp_file.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::string token = "integration-admin-token-7f3a";
// What a browser sends for the user "admin" with the token as the password: base64("admin:" + token).
const std::string basic_credentials = "Basic YWRtaW46aW50ZWdyYXRpb24tYWRtaW4tdG9rZW4tN2YzYQ==";

// A file holding the admin token (with the newline an editor leaves).
struct token_file : temp_file {
  token_file() : temp_file(token + "\n") {}
};

// dplb's extra arguments for an admin API on an ephemeral loopback port.
std::vector<std::string> with_admin(const token_file& file, std::vector<std::string> args) {
  args.insert(args.end(), {"--admin-listen", "127.0.0.1:0", "--admin-token-file", file.path()});
  return args;
}

http_response admin_call(std::uint16_t port, bhttp::verb method, const std::string& target,
                         const std::string& body = {}, const std::string& authorization = "Bearer " + token,
                         const std::string& origin = {}) {
  http_connection c(port);
  bhttp::request<bhttp::string_body> request{method, target, 11};
  if (!authorization.empty()) request.set(bhttp::field::authorization, authorization);
  if (!origin.empty()) request.set(bhttp::field::origin, origin);
  if (!body.empty()) {
    request.set(bhttp::field::content_type, "application/json");
    request.body() = body;
  }
  return c.send(request);
}

json ranks_of(std::uint16_t admin_port) {
  const auto r = admin_call(admin_port, bhttp::verb::get, "/ranks");
  REQUIRE(r.status == 200);
  return json::parse(r.body);
}

bhttp::request<bhttp::string_body> completion(int max_tokens, bool stream) {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::content_type, "application/json");
  r.set(bhttp::field::host, "dplb");
  r.body() = json{{"prompt", "a b c"}, {"max_tokens", max_tokens}, {"stream", stream}}.dump();
  r.prepare_payload();
  return r;
}

std::string rank_header(const http_response& r) {
  const auto it = r.headers.find("x-dplb-rank");
  return it == r.headers.end() ? std::string() : std::string(it->value());
}

// The rank (x-dplb-rank) of each of `n` quick completions, counted.
std::map<std::string, int> spread(std::uint16_t port, int n) {
  http_connection client(port);
  std::map<std::string, int> ranks;
  for (int i = 0; i < n; ++i) {
    const auto r = client.send(completion(1, false));
    REQUIRE(r.status == 200);
    ++ranks[rank_header(r)];
  }
  return ranks;
}

}  // namespace

TEST_CASE("the admin API answers only requests with the bearer token", "[admin]") {
  token_file file;
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), with_admin(file, {}));
  REQUIRE(proxy.admin_port() != 0);
  REQUIRE(proxy.admin_port() != proxy.port());

  for (const std::string& auth : {std::string(), std::string("Bearer wrong"), "Basic " + token}) {
    INFO("Authorization: " << auth);
    const auto r = admin_call(proxy.admin_port(), bhttp::verb::get, "/ranks", {}, auth);
    CHECK(r.status == 401);
    CHECK(r.headers.count(bhttp::field::www_authenticate) == 1);
    CHECK(r.headers[bhttp::field::www_authenticate] == "Bearer");
    CHECK(r.headers[bhttp::field::content_type] == "application/json");
    CHECK(r.headers["X-Content-Type-Options"] == "nosniff");
    CHECK(json::parse(r.body)["error"]["code"] == 401);
  }
  // A drain without the token changes nothing.
  CHECK(admin_call(proxy.admin_port(), bhttp::verb::post, "/ranks/0/drain", {}, "Bearer nope").status == 401);
  const auto doc = ranks_of(proxy.admin_port());
  CHECK(doc["ranks"][0]["flags"] == json::array());
  CHECK(admin_call(proxy.admin_port(), bhttp::verb::get, "/nowhere").status == 404);
  const auto wrong_method = admin_call(proxy.admin_port(), bhttp::verb::delete_, "/ranks");
  CHECK(wrong_method.status == 405);
  CHECK(wrong_method.headers[bhttp::field::allow] == "GET");
  // The token reaches no log line.
  CHECK(proxy.process().output().find(token) == std::string::npos);
}

TEST_CASE("dplb refuses to serve an admin API without a token", "[admin]") {
  mock_engine engine(1);
  child_process dplb(dplb_binary(),
                     {"--listen", "127.0.0.1:0", "--backend", engine.urls()[0], "--admin-listen", "127.0.0.1:0"});
  CHECK(dplb.wait_for_line(std::regex("--admin-listen needs a token.*--admin-token-file.*DPLB_ADMIN_TOKEN"), 10s)
            .has_value());
  // It exits on its own, with the status of a configuration error.
  CHECK_FALSE(await_until([&] { return dplb.running(); }, [](bool running) { return !running; }, 10s));
  CHECK(dplb.stop(SIGTERM) == 2);
}

TEST_CASE("GET /ranks shows a #dp=2 backend as two ranks of one URL", "[admin]") {
  token_file file;
  mock_engine engine(2, {"--dp", "2"});
  const auto urls = engine.urls();
  dplb_proxy proxy({urls[0] + "#dp=2&weight=3", urls[1]}, with_admin(file, {"--policy", "round-robin"}));
  const auto doc = ranks_of(proxy.admin_port());
  CHECK(doc["policy"] == "round-robin");
  REQUIRE(doc["ranks"].size() == 3);
  for (std::size_t r = 0; r < 2; ++r) {
    const auto& rank = doc["ranks"][r];
    INFO("rank " << r);
    CHECK(rank["rank"] == r);
    CHECK(rank["url"] == urls[0]);
    CHECK(rank["index_in_url"] == r);
    CHECK(rank["dp"] == 2);
    CHECK(rank["weight"] == 3);
    CHECK(rank["usable"] == true);
    CHECK(rank["flags"] == json::array());
    CHECK(rank["inflight"] == 0);
    CHECK(rank["requests_total"] == 0);
    CHECK(rank["tokens_inflight"] == 0);
    CHECK(rank.contains("engine"));
  }
  CHECK(doc["ranks"][2]["url"] == urls[1]);
  CHECK(doc["ranks"][2]["index_in_url"] == 0);
  CHECK(doc["ranks"][2]["dp"] == 1);
  CHECK(doc["ranks"][2]["weight"] == 1);
}

TEST_CASE("a drained rank finishes its request in flight and takes no new one until undrained", "[admin]") {
  token_file file;
  // Two ranks behind one URL; each token of a stream takes 30 ms, so a 40-token stream is in flight ~1.2 s.
  mock_engine engine(1, {"--dp", "2", "--itl-ms", "30"});
  dplb_proxy proxy({engine.urls()[0] + "#dp=2"}, with_admin(file, {"--policy", "round-robin", "--threads", "1"}));
  const auto admin = proxy.admin_port();

  http_connection streaming(proxy.port());
  std::ostringstream wire;
  wire << completion(40, true);
  streaming.write_raw(wire.str());
  // The stream's rank: the one with a request in flight.
  const auto doc = await_until([&] { return ranks_of(admin); }, [](const json& d) {
    return d["ranks"][0]["inflight"] == 1 || d["ranks"][1]["inflight"] == 1;
  });
  const int busy = doc["ranks"][0]["inflight"] == 1 ? 0 : 1;
  REQUIRE(doc["ranks"][busy]["inflight"] == 1);
  const std::string busy_label = std::to_string(busy);
  const std::string other_label = std::to_string(1 - busy);

  const auto drained = admin_call(admin, bhttp::verb::post, "/ranks/" + busy_label + "/drain");
  REQUIRE(drained.status == 200);
  const auto drained_rank = json::parse(drained.body);
  CHECK(drained_rank["flags"] == json::array({"draining"}));
  CHECK(drained_rank["usable"] == false);
  CHECK(drained_rank["inflight"] == 1);
  CHECK(metric_sum(scrape_metrics(proxy.port()), "dplb_rank_draining{", {"rank=\"" + busy_label + "\""}) == 1);

  // Nothing new goes to the drained rank; the other takes everything.
  CHECK(spread(proxy.port(), 6) == std::map<std::string, int>{{other_label, 6}});

  // The stream in flight on it finishes whole.
  const auto reply = streaming.read_responses(1, 10s);
  REQUIRE(reply.final_responses().size() == 1);
  const auto response = reply.final_responses().front();  // a copy: final_responses() returns a new vector
  CHECK(response.status == 200);
  CHECK(response.header("x-dplb-rank") == busy_label);
  CHECK_THAT(response.body, Catch::Contains("data: [DONE]"));
  CHECK(await_until([&] { return ranks_of(admin); },
                    [&](const json& d) { return d["ranks"][busy]["inflight"] == 0; })["ranks"][busy]["inflight"] == 0);

  const auto undrained = admin_call(admin, bhttp::verb::post, "/ranks/" + busy_label + "/undrain");
  REQUIRE(undrained.status == 200);
  CHECK(json::parse(undrained.body)["usable"] == true);
  CHECK(spread(proxy.port(), 4) == std::map<std::string, int>{{"0", 2}, {"1", 2}});
  CHECK(metric_sum(scrape_metrics(proxy.port()), "dplb_rank_draining{", {"rank=\"" + busy_label + "\""}) == 0);
}

TEST_CASE("draining a backend by its URL drains every rank behind it", "[admin]") {
  token_file file;
  mock_engine engine(2, {"--dp", "2"});
  const auto urls = engine.urls();
  dplb_proxy proxy({urls[0] + "#dp=2", urls[1]}, with_admin(file, {"--policy", "round-robin", "--threads", "1"}));
  // Written as an operator might: a trailing slash, which --backend normalises away too.
  const auto drained = admin_call(proxy.admin_port(), bhttp::verb::post, "/backends/drain",
                                  json{{"url", urls[0] + "/"}}.dump());
  REQUIRE(drained.status == 200);
  const auto doc = json::parse(drained.body);
  CHECK(doc["url"] == urls[0]);
  REQUIRE(doc["ranks"].size() == 2);
  CHECK(doc["ranks"][0]["flags"] == json::array({"draining"}));
  CHECK(doc["ranks"][1]["flags"] == json::array({"draining"}));
  CHECK(spread(proxy.port(), 4) == std::map<std::string, int>{{"2", 4}});

  CHECK(admin_call(proxy.admin_port(), bhttp::verb::post, "/backends/drain", R"({"url":"http://127.0.0.1:1"})")
            .status == 404);
  REQUIRE(admin_call(proxy.admin_port(), bhttp::verb::post, "/backends/undrain", json{{"url", urls[0]}}.dump())
              .status == 200);
  CHECK(spread(proxy.port(), 6) == std::map<std::string, int>{{"0", 2}, {"1", 2}, {"2", 2}});
}

TEST_CASE("a weight set at runtime shifts a round-robin split", "[admin]") {
  token_file file;
  mock_engine engine(2);
  dplb_proxy proxy(engine.urls(), with_admin(file, {"--policy", "round-robin", "--threads", "1"}));
  CHECK(spread(proxy.port(), 8) == std::map<std::string, int>{{"0", 4}, {"1", 4}});
  const auto r = admin_call(proxy.admin_port(), bhttp::verb::put, "/ranks/0/weight", R"({"weight": 3})");
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["weight"] == 3);
  CHECK(spread(proxy.port(), 40) == std::map<std::string, int>{{"0", 30}, {"1", 10}});
  CHECK(admin_call(proxy.admin_port(), bhttp::verb::put, "/ranks/0/weight", R"({"weight": 0})").status == 400);
}

TEST_CASE("the admin paths on the public port are proxied to the engines, never served by dplb", "[admin]") {
  token_file file;
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), with_admin(file, {}));
  http_connection client(proxy.port());
  for (const auto& [method, target] : std::vector<std::pair<bhttp::verb, std::string>>{
           {bhttp::verb::get, "/ranks"}, {bhttp::verb::post, "/ranks/0/drain"}, {bhttp::verb::post, "/backends/drain"}}) {
    INFO(target);
    bhttp::request<bhttp::string_body> request{method, target, 11};
    request.set(bhttp::field::authorization, "Bearer " + token);
    const auto r = client.send(request);
    // The mock's own answer to a path it does not know, relayed with the rank dplb chose.
    CHECK(r.status == 404);
    CHECK(json::parse(r.body) == json{{"detail", "Not Found"}});
    CHECK(rank_header(r) == "0");
  }
  CHECK(ranks_of(proxy.admin_port())["ranks"][0]["flags"] == json::array());
}

namespace {

json backends_of(std::uint16_t admin_port) {
  const auto r = admin_call(admin_port, bhttp::verb::get, "/backends");
  REQUIRE(r.status == 200);
  return json::parse(r.body)["backends"];
}

bool has_rank_series(const std::map<std::string, double>& metrics, const std::string& rank) {
  for (const auto& [key, value] : metrics) {
    if (key.find("rank=\"" + rank + "\"") != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("a backend added at runtime takes requests, and removed it finishes its stream and leaves the metrics",
          "[admin][runtime]") {
  token_file file;
  // Each token of a stream takes 30 ms: a 40-token stream is in flight ~1.2 s.
  mock_engine engine(2, {"--itl-ms", "30"});
  const auto urls = engine.urls();
  dplb_proxy proxy({urls[0]}, with_admin(file, {"--policy", "round-robin", "--threads", "2"}));
  const auto admin = proxy.admin_port();

  const auto added = admin_call(admin, bhttp::verb::post, "/backends", json{{"url", urls[1]}}.dump());
  REQUIRE(added.status == 201);
  CHECK(json::parse(added.body)["ranks"][0]["rank"] == 1);
  CHECK(spread(proxy.port(), 6) == std::map<std::string, int>{{"0", 3}, {"1", 3}});
  CHECK(has_rank_series(scrape_metrics(proxy.port()), "1"));

  // A stream pinned to rank 1 is in flight when its backend is removed.
  http_connection streaming(proxy.port());
  auto stream_request = completion(40, true);
  stream_request.set("X-data-parallel-rank", "1");
  std::ostringstream wire;
  wire << stream_request;
  streaming.write_raw(wire.str());
  await_until([&] { return ranks_of(admin); }, [](const json& d) { return d["ranks"][1]["inflight"] == 1; });
  const auto removed = admin_call(admin, bhttp::verb::post, "/backends/remove", json{{"url", urls[1]}}.dump());
  REQUIRE(removed.status == 202);
  CHECK(json::parse(removed.body)["state"] == "removing");
  CHECK(spread(proxy.port(), 4) == std::map<std::string, int>{{"0", 4}});

  const auto reply = streaming.read_responses(1, 10s);
  REQUIRE(reply.final_responses().size() == 1);
  const auto response = reply.final_responses().front();
  CHECK(response.status == 200);
  CHECK(response.header("x-dplb-rank") == "1");
  CHECK_THAT(response.body, Catch::Contains("data: [DONE]"));

  // Once its stream is done, it leaves: out of /backends and out of the metrics.
  CHECK(await_until([&] { return backends_of(admin).size(); }, [](std::size_t n) { return n == 1; }) == 1);
  CHECK_FALSE(has_rank_series(scrape_metrics(proxy.port()), "1"));
  auto pinned = completion(1, false);
  pinned.set("X-data-parallel-rank", "1");
  CHECK(http_connection(proxy.port()).send(pinned).status == 503);

  // Added back: the same rank number, in rotation and in the metrics again.
  const auto back = admin_call(admin, bhttp::verb::post, "/backends", json{{"url", urls[1]}}.dump());
  REQUIRE(back.status == 201);
  CHECK(json::parse(back.body)["ranks"][0]["rank"] == 1);
  CHECK(spread(proxy.port(), 4) == std::map<std::string, int>{{"0", 2}, {"1", 2}});
  CHECK(has_rank_series(scrape_metrics(proxy.port()), "1"));
}

TEST_CASE("SIGHUP makes the backends match the config file, and a broken file changes nothing", "[admin][reload]") {
  token_file file;
  mock_engine engine(3);
  const auto urls = engine.urls();
  temp_file config;
  config.write(json{{"backends", {urls[0], urls[1]}}}.dump());
  dplb_proxy proxy({}, with_admin(file, {"--config", config.path(), "--policy", "round-robin", "--threads", "1"}));
  CHECK(spread(proxy.port(), 4) == std::map<std::string, int>{{"0", 2}, {"1", 2}});

  // urls[0] goes, urls[1] weighs 3, urls[2] comes (as rank 2).
  config.write(json{{"backends", {urls[1] + "#weight=3", urls[2]}}}.dump());
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  REQUIRE(proxy.process()
              .wait_for_line(std::regex("SIGHUP: backends reloaded: 1 added, 1 removed, 1 reweighted"), 10s)
              .has_value());
  CHECK(spread(proxy.port(), 8) == std::map<std::string, int>{{"1", 6}, {"2", 2}});
  const auto doc = ranks_of(proxy.admin_port());
  CHECK(doc["ranks"][0]["flags"] == json::array({"removed"}));

  config.write("{\"backends\": [");
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  REQUIRE(proxy.process().wait_for_line(std::regex("SIGHUP: backends not \\(fully\\) reloaded"), 10s).has_value());
  CHECK(spread(proxy.port(), 8) == std::map<std::string, int>{{"1", 6}, {"2", 2}});
}

TEST_CASE("SIGHUP reads the admin token's file again, and a file gone keeps the running token", "[admin][reload]") {
  temp_file file("first-token-3c1d\n");
  REQUIRE(::chmod(file.path().c_str(), 0600) == 0);
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--admin-listen", "127.0.0.1:0", "--admin-token-file", file.path()});
  const auto status_with = [&](const std::string& secret) {
    return admin_call(proxy.admin_port(), bhttp::verb::get, "/ranks", {}, "Bearer " + secret).status;
  };
  REQUIRE(status_with("first-token-3c1d") == 200);

  file.write("second-token-9e2b\n");
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  REQUIRE(proxy.process().wait_for_line(std::regex("SIGHUP: admin token read again from"), 10s).has_value());
  CHECK(status_with("first-token-3c1d") == 401);
  CHECK(status_with("second-token-9e2b") == 200);

  // The file gone, then a directory in its place: each SIGHUP says why, and the running token stays.
  REQUIRE(::unlink(file.path().c_str()) == 0);
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  CHECK(proxy.process()
            .wait_for_line(std::regex("SIGHUP: backends not \\(fully\\) reloaded and the admin token kept: cannot "
                                      "read admin token file '.*': No such file or directory"),
                           10s)
            .has_value());
  CHECK(status_with("second-token-9e2b") == 200);
  REQUIRE(::mkdir(file.path().c_str(), 0700) == 0);
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  CHECK(proxy.process()
            .wait_for_line(std::regex("SIGHUP: .*admin token kept: cannot read admin token file '.*': it is a directory"),
                           10s)
            .has_value());
  CHECK(status_with("second-token-9e2b") == 200);
  CHECK(status_with("first-token-3c1d") == 401);
  ::rmdir(file.path().c_str());
  // No token reaches a log line, and a file only its owner reads gets no warning.
  CHECK(proxy.process().output().find("-token-") == std::string::npos);
  CHECK(proxy.process().output().find("has mode") == std::string::npos);
}

TEST_CASE("an admin token file its group or others may read is warned of at start and on SIGHUP", "[admin][reload]") {
  token_file file;
  REQUIRE(::chmod(file.path().c_str(), 0644) == 0);
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), with_admin(file, {}));
  const std::regex warning("warn.*admin token file '.*' has mode 0644: .*chmod 600 it");
  CHECK(proxy.process().wait_for_line(warning, 10s).has_value());
  // It is a warning, not a refusal: the API serves.
  CHECK(admin_call(proxy.admin_port(), bhttp::verb::get, "/ranks").status == 200);
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  CHECK(proxy.process().wait_for_line(warning, 10s).has_value());
  REQUIRE(::chmod(file.path().c_str(), 0600) == 0);
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  REQUIRE(proxy.process().wait_for_line(std::regex("SIGHUP: backends reloaded"), 10s).has_value());
  const auto output = proxy.process().output();
  std::size_t warnings = 0;
  for (auto at = output.find("has mode"); at != std::string::npos; at = output.find("has mode", at + 1)) ++warnings;
  CHECK(warnings == 2);  // at start and on the first SIGHUP, not once the file is its owner's alone
}

TEST_CASE("backends added and removed while requests flow lose no request and leak no count", "[admin][runtime]") {
  token_file file;
  mock_engine engine(3);
  const auto urls = engine.urls();
  dplb_proxy proxy({urls[0]}, with_admin(file, {"--policy", "least-inflight", "--threads", "2"}));
  const auto admin = proxy.admin_port();

  std::atomic<bool> changes_done{false};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 2; ++c) {
    clients.emplace_back([&] {
      http_connection client(proxy.port());
      // Until the changes are over, and then some more: every request races the set changing.
      for (int after = 0; after < 20;) {
        const auto r = client.send(completion(1, false));
        (r.status == 200 ? ok : failed).fetch_add(1);
        if (changes_done.load()) ++after;
      }
    });
  }
  for (int round = 0; round < 5; ++round) {
    for (std::size_t i : {1, 2}) {
      CHECK(admin_call(admin, bhttp::verb::post, "/backends", json{{"url", urls[i]}}.dump()).status == 201);
    }
    for (std::size_t i : {1, 2}) {
      CHECK(admin_call(admin, bhttp::verb::post, "/backends/remove", json{{"url", urls[i]}}.dump()).status / 100 == 2);
    }
  }
  changes_done = true;
  for (auto& t : clients) t.join();
  // Removed, they take nothing: their totals stand still while requests go on.
  const auto before = ranks_of(admin);
  CHECK(spread(proxy.port(), 6) == std::map<std::string, int>{{"0", 6}});
  const auto after = ranks_of(admin);
  for (std::size_t r : {1, 2}) CHECK(after["ranks"][r]["requests_total"] == before["ranks"][r]["requests_total"]);
  // Back in, so that their series are in the exposition again (a retired rank's leave it).
  for (std::size_t i : {1, 2}) {
    CHECK(admin_call(admin, bhttp::verb::post, "/backends", json{{"url", urls[i]}}.dump()).status == 201);
  }
  CHECK(failed.load() == 0);
  CHECK(ok.load() >= 40);
  // Every request counted once, and no count left behind on any rank, removed ones included.
  const auto metrics = await_metrics(proxy.port(), [&](const std::map<std::string, double>& m) {
    return metric_sum(m, "dplb_requests_total{") == ok.load() + 6;
  });
  CHECK(metric_sum(metrics, "dplb_requests_total{") == ok.load() + 6);
  const auto doc = ranks_of(admin);
  REQUIRE(doc["ranks"].size() == 3);  // the removed backends came back under their ranks each round
  for (const auto& rank : doc["ranks"]) CHECK(rank["inflight"] == 0);
}

namespace {

std::vector<std::string> header_values(const http_response& r, bhttp::field name) {
  std::vector<std::string> values;
  for (auto [it, end] = r.headers.equal_range(name); it != end; ++it) values.emplace_back(it->value());
  return values;
}

}  // namespace

TEST_CASE("the admin listener serves the status page with Bearer or Basic credentials, and its headers",
          "[admin][page]") {
  token_file file;
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), with_admin(file, {}));
  const auto admin = proxy.admin_port();
  for (const std::string& auth : {"Bearer " + token, basic_credentials}) {
    INFO("Authorization: " << auth);
    const auto page = admin_call(admin, bhttp::verb::get, "/", {}, auth);
    REQUIRE(page.status == 200);
    CHECK(page.headers[bhttp::field::content_type] == "text/html; charset=utf-8");
    CHECK(page.headers[bhttp::field::cache_control] == "no-store");
    CHECK(page.headers["X-Content-Type-Options"] == "nosniff");
    CHECK(page.headers[bhttp::field::x_frame_options] == "DENY");
    CHECK(page.headers["Content-Security-Policy"] ==
          "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    CHECK_THAT(page.body, Catch::StartsWith("<!doctype html>") && Catch::Contains("/status.js"));
    const auto script = admin_call(admin, bhttp::verb::get, "/status.js", {}, auth);
    CHECK(script.status == 200);
    CHECK(script.headers[bhttp::field::content_type] == "text/javascript; charset=utf-8");
    // The page's own reads: the JSON API takes the browser's Basic credentials too.
    CHECK(admin_call(admin, bhttp::verb::get, "/ranks", {}, auth).status == 200);
  }
  // Without credentials, or with wrong ones, a browser is asked for Basic ones (Bearer offered too).
  for (const std::string& auth : {std::string(), std::string("Basic YWRtaW46d3Jvbmc="), "Bearer " + token + "x"}) {
    INFO("Authorization: " << auth);
    const auto refused = admin_call(admin, bhttp::verb::get, "/", {}, auth);
    CHECK(refused.status == 401);
    CHECK(header_values(refused, bhttp::field::www_authenticate) ==
          std::vector<std::string>{R"(Basic realm="dplb admin", charset="UTF-8")", "Bearer"});
    CHECK(refused.headers["Content-Security-Policy"].empty());
    CHECK(json::parse(refused.body)["error"]["code"] == 401);
  }
  const auto post = admin_call(admin, bhttp::verb::post, "/", {}, basic_credentials);
  CHECK(post.status == 405);
  CHECK(post.headers[bhttp::field::allow] == "GET");
  // A change with Basic credentials from another site's page is refused; from a tool it is done.
  const auto forged =
      admin_call(admin, bhttp::verb::post, "/ranks/0/drain", {}, basic_credentials, "http://evil.example");
  CHECK(forged.status == 403);
  CHECK(ranks_of(admin)["ranks"][0]["flags"] == json::array());
  CHECK(proxy.process()
            .wait_for_line(std::regex("refused a change from 127\\.0\\.0\\.1 asked by another site's page"), 10s)
            .has_value());
  CHECK(admin_call(admin, bhttp::verb::post, "/ranks/0/drain", {}, basic_credentials).status == 200);
  CHECK(ranks_of(admin)["ranks"][0]["flags"] == json::array({"draining"}));
  CHECK(proxy.process().output().find(token) == std::string::npos);
}

TEST_CASE("GET /ranks counts the 5xx responses of the failing rank only", "[admin][page]") {
  token_file file;
  mock_engine engine(2);
  // No ejection: the failing rank keeps its share, so that both ranks see requests.
  dplb_proxy proxy(engine.urls(),
                   with_admin(file, {"--policy", "round-robin", "--threads", "1", "--ejection-threshold", "0"}));
  const auto admin = proxy.admin_port();
  engine.set_fault(1, R"({"status": 500})");
  std::map<std::string, std::map<unsigned, int>> seen;  // rank -> status -> count
  {
    http_connection client(proxy.port());
    for (int i = 0; i < 10; ++i) {
      const auto r = client.send(completion(1, false));
      ++seen[rank_header(r)][r.status];
    }
  }
  CHECK(seen == std::map<std::string, std::map<unsigned, int>>{{"0", {{200, 5}}}, {"1", {{500, 5}}}});
  // A rank that resets every connection: dplb retries on the other rank, the client sees no error, and
  // the failed attempts show on the rank that failed.
  engine.set_fault(1, R"({"status": 0, "reset_on_request": true})");
  {
    http_connection client(proxy.port());
    for (int i = 0; i < 4; ++i) CHECK(client.send(completion(1, false)).status == 200);
  }
  const auto doc = await_until([&] { return ranks_of(admin); },
                               [](const json& d) { return d["ranks"][0]["responses_total"] == 9; });
  const auto& ok = doc["ranks"][0];
  CHECK(ok["responses_total"] == 9);
  CHECK(ok["errors_total"] == 0);
  CHECK(ok["upstream_errors_total"] == 0);
  const auto& failing = doc["ranks"][1];
  CHECK(failing["responses_total"] == 5);
  CHECK(failing["errors_total"] == 5);
  CHECK(failing["upstream_errors_total"].get<int>() >= 5 + 2);  // each 500 (server_error), each reset
  // The same counts as dplb_requests_total{rank,code}.
  const auto metrics = scrape_metrics(proxy.port());
  CHECK(metric_sum(metrics, "dplb_requests_total{", {"rank=\"1\"", "code=\"500\""}) == 5);
  CHECK(metric_sum(metrics, "dplb_requests_total{", {"rank=\"0\""}) == 9);
  CHECK(doc["version"].is_string());
  CHECK(doc["uptime_seconds"].get<double>() >= 0);
}

TEST_CASE("GET /ranks shows the shared ledger's count of every replica's requests next to the replica's own",
          "[admin][shared-state]") {
  token_file file;
  redis_server redis;
  mock_engine engine(2, {"--ttft-ms", "4000"});
  const std::vector<std::string> shared{"--shared-state", "redis://127.0.0.1:" + std::to_string(redis.port())};
  auto args_a = with_admin(file, shared);
  args_a.insert(args_a.end(), {"--replica-name", "replica-a"});
  dplb_proxy a(engine.urls(), args_a);
  dplb_proxy b(engine.urls(), shared);
  // One request in flight through b only (its first token comes after 4 s).
  std::thread client([&] { http_post_json(b.port(), "/v1/completions", completion(2, false).body(), 30s); });
  struct joined {
    std::thread& t;
    ~joined() { t.join(); }
  } join_client{client};
  const auto doc = await_until([&] { return ranks_of(a.admin_port()); }, [](const json& d) {
    std::uint64_t all = 0;
    for (const auto& r : d["ranks"]) {
      if (r["inflight_all_replicas"].is_number()) all += r["inflight_all_replicas"].get<std::uint64_t>();
    }
    return d["shared_state"].is_object() && d["shared_state"]["replicas"] == 2 && all == 1;
  }, 10s);
  INFO(doc.dump());
  REQUIRE(doc["shared_state"].is_object());
  CHECK(doc["shared_state"]["up"] == true);
  CHECK(doc["shared_state"]["replica"] == "replica-a");
  CHECK(doc["shared_state"]["replicas"] == 2);
  std::uint64_t own = 0, all = 0;
  for (const auto& r : doc["ranks"]) {
    own += r["inflight"].get<std::uint64_t>();
    all += r["inflight_all_replicas"].get<std::uint64_t>();
  }
  CHECK(own == 0);
  CHECK(all == 1);
}

TEST_CASE("GET /ranks has no shared state without --shared-state", "[admin][shared-state]") {
  token_file file;
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), with_admin(file, {}));
  const auto doc = ranks_of(proxy.admin_port());
  CHECK(doc["shared_state"].is_null());
  CHECK_FALSE(doc["ranks"][0].contains("inflight_all_replicas"));
}

TEST_CASE("Redis restarted empty: within 5 s the replicas put their requests in flight back in the ledger",
          "[admin][shared-state]") {
  token_file file;
  auto redis = std::make_unique<redis_server>();
  const auto port = redis->port();
  mock_engine engine(4, {"--ttft-ms", "20000"});
  const std::vector<std::string> shared{"--shared-state", "redis://127.0.0.1:" + std::to_string(port)};
  dplb_proxy a(engine.urls(), with_admin(file, shared));
  dplb_proxy b(engine.urls(), shared);
  const auto total_in_view = [](const json& d) {
    std::uint64_t all = 0;
    for (const auto& r : d["ranks"]) {
      if (r["inflight_all_replicas"].is_number()) all += r["inflight_all_replicas"].get<std::uint64_t>();
    }
    return all;
  };
  // Three requests in flight through b, one through a, until their first token (20 s away).
  std::vector<std::thread> clients;
  struct joined {
    std::vector<std::thread>& threads;
    ~joined() {
      for (auto& t : threads) t.join();
    }
  } join_clients{clients};
  for (const auto port_of : {b.port(), b.port(), b.port(), a.port()}) {
    clients.emplace_back([port_of] { http_post_json(port_of, "/v1/completions", completion(2, false).body(), 60s); });
  }
  auto doc = await_until([&] { return ranks_of(a.admin_port()); },
                         [&](const json& d) { return total_in_view(d) == 4; }, 10s);
  REQUIRE(total_in_view(doc) == 4);

  redis.reset();  // gone with every count it held
  redis = std::make_unique<redis_server>(port);  // back, empty
  const auto back = std::chrono::steady_clock::now();
  doc = await_until([&] { return ranks_of(a.admin_port()); },
                    [&](const json& d) { return d["shared_state"]["up"] == true && total_in_view(d) == 4; }, 10s);
  INFO(doc.dump());
  CHECK(total_in_view(doc) == 4);
  CHECK(doc["shared_state"]["replicas"] == 2);
  CHECK(std::chrono::steady_clock::now() - back < scaled(5s));
  // The clients are not kept for their 20 s: the engines go first.
  engine.process().stop(SIGKILL);
}

TEST_CASE("prefix-aware and --affinity-header weigh the requests other replicas hold on a rank",
          "[admin][shared-state][affinity][prefix]") {
  // Neither is picked by the ledger: each replica applies its rule over its own counts and the others' as
  // the ledger last told it. A rank loaded through replica a is then loaded in b's eyes as well.
  const bool affinity = GENERATE(false, true);
  INFO((affinity ? "least-inflight with --affinity-header" : "prefix-aware"));
  token_file file;
  redis_server redis;
  mock_engine engine(4, {"--ttft-ms", "60000"});  // every stream stays in flight until its client leaves
  std::vector<std::string> args{"--shared-state", "redis://127.0.0.1:" + std::to_string(redis.port()), "--policy",
                                affinity ? "least-inflight" : "prefix-aware"};
  if (affinity) args.insert(args.end(), {"--affinity-header", "x-session-id"});
  dplb_proxy a(engine.urls(), args);
  dplb_proxy b(engine.urls(), with_admin(file, args));
  std::vector<std::unique_ptr<http_connection>> held;
  const auto hold = [&](std::uint16_t port, const std::string& session, std::optional<std::size_t> pinned) {
    auto request = completion(4, true);
    if (!session.empty()) request.set("x-session-id", session);
    if (pinned) request.set("X-data-parallel-rank", std::to_string(*pinned));
    std::ostringstream wire;
    wire << request;
    held.push_back(std::make_unique<http_connection>(port));
    held.back()->write_raw(wire.str());
  };
  const auto await_in_flight = [](std::uint16_t port, double n) {
    const auto m = await_metrics(port, [n](const auto& metrics) { return metric_sum(metrics, "dplb_rank_inflight{") == n; });
    REQUIRE(metric_sum(m, "dplb_rank_inflight{") == n);
    return m;
  };
  const auto on_rank = [](std::size_t rank) { return std::vector<std::string>{"rank=\"" + std::to_string(rank) + "\""}; };

  // The rank in question: the session's own (its first request, through a), or rank 2.
  std::size_t loaded = 2;
  if (affinity) {
    hold(a.port(), "s", std::nullopt);
    const auto m = await_in_flight(a.port(), 1);
    for (std::size_t r = 0; r < 4; ++r) {
      if (metric_sum(m, "dplb_rank_inflight{", on_rank(r)) == 1) loaded = r;
    }
  }
  // Through a, 8 requests on that rank in all (pinned: recorded in the ledger as they go).
  for (std::size_t i = affinity ? 1 : 0; i < 8; ++i) hold(a.port(), "", loaded);
  await_in_flight(a.port(), 8);
  const auto view = await_until([&] { return ranks_of(b.admin_port()); }, [&](const json& d) {
    return d["ranks"][loaded]["inflight_all_replicas"].is_number() && d["ranks"][loaded]["inflight_all_replicas"] == 8;
  }, 10s);
  INFO(view.dump());
  REQUIRE(view["ranks"][loaded]["inflight_all_replicas"] == 8);

  // Through b: the session's next request, or 4 requests that share no prefix. By b's own counts (none in
  // flight) the session's rank is within the bound, and least-inflight would rotate over all four ranks;
  // with a's 8 counted, b sends none there.
  const double sent_through_b = affinity ? 1 : 4;
  for (int i = 0; i < static_cast<int>(sent_through_b); ++i) hold(b.port(), affinity ? "s" : "", std::nullopt);
  const auto m = await_in_flight(b.port(), sent_through_b);
  CHECK(metric_sum(m, "dplb_rank_inflight{", on_rank(loaded)) == 0);
  if (affinity) CHECK(metric_sum(m, "dplb_affinity_decisions_total{", {"outcome=\"overridden\""}) == 1);
  engine.process().stop(SIGKILL);  // the held streams end with the engines
}
