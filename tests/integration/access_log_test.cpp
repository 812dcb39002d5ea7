// --access-log: one JSON line per request, with what the client got, written off the event loops; off by
// default; SIGHUP reopens the file after a rotation.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <set>
#include <fstream>
#include <sstream>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "raw_engine.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::filesystem::path temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "dplb-access-XXXXXX").string();
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

std::vector<json> read_lines(const std::filesystem::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));  // throws if not JSON
  return lines;
}

// The log's lines once there are `count` of them (the writing thread lags the responses a little).
std::vector<json> await_lines(const std::filesystem::path& path, std::size_t count) {
  return await_until([&] { return std::filesystem::exists(path) ? read_lines(path) : std::vector<json>{}; },
                     [&](const std::vector<json>& lines) { return lines.size() >= count; });
}

bhttp::request<bhttp::string_body> completion(bool stream, const std::string& target = "/v1/completions",
                                              int max_tokens = 4) {
  json body{{"model", "mock-model"}, {"prompt", "w1 w2 w3"}, {"max_tokens", max_tokens}, {"stream", stream}};
  if (stream) body["stream_options"] = {{"include_usage", true}};
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, target, 11};
  r.set(bhttp::field::content_type, "application/json");
  r.body() = body.dump();
  return r;
}

}  // namespace

TEST_CASE("the access log has a line per request with its rank, status, bytes, times and tokens", "[access-log]") {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  mock_engine engine(2);
  dplb_proxy proxy(engine.urls(), {"--policy", "round-robin", "--access-log", path.string(),
                                   "--max-request-body-bytes", "2048"});
  http_connection client(proxy.port());
  const auto plain = client.send(completion(false, "/v1/completions?user=%22a%5Cb%22"));
  const auto streamed = client.send_streaming(completion(true));
  REQUIRE(plain.status == 200);
  REQUIRE(streamed.status == 200);
  // Not logged: dplb's own paths.
  REQUIRE(http_get(proxy.port(), "/metrics").status == 200);
  REQUIRE(http_get(proxy.port(), "/health").status == 200);
  // Refused by dplb itself, before any rank: 413.
  const auto refused = http_post_json(proxy.port(), "/v1/completions", std::string(4096, ' ') + "{}");
  REQUIRE(refused.status == 413);

  const auto lines = await_lines(path, 3);
  REQUIRE(lines.size() == 3);
  const auto& a = lines[0];
  CHECK(a["rank"] == 0);
  CHECK(a["method"] == "POST");
  CHECK(a["path"] == "/v1/completions?user=%22a%5Cb%22");
  CHECK(a["status"] == 200);
  CHECK(a["bytes"] == plain.body.size());
  const auto usage = json::parse(plain.body)["usage"];
  CHECK(a["prompt_tokens"] == usage["prompt_tokens"]);
  CHECK(a["completion_tokens"] == 4);
  CHECK(a["tokens"] == usage["prompt_tokens"].get<int>() + 4);
  CHECK(a["ttfb"].is_number());
  CHECK(a["duration"].get<double>() >= a["ttfb"].get<double>());
  CHECK(a["client"].get<std::string>().rfind("127.0.0.1:", 0) == 0);
  CHECK(a["time"].get<std::string>().size() == 24);  // 2026-12-04T19:55:30.134Z
  CHECK(a["time"].get<std::string>().back() == 'Z');

  const auto& b = lines[1];
  CHECK(b["rank"] == 1);
  CHECK(b["status"] == 200);
  CHECK(b["bytes"] == streamed.body.size());  // the stream's body as the client decoded it
  CHECK(b["completion_tokens"] == 4);

  const auto& c = lines[2];
  CHECK(c["rank"].is_null());
  CHECK(c["status"] == 413);
  CHECK(c["bytes"] == refused.body.size());
  CHECK(c["ttfb"].is_null());
  CHECK(c["tokens"].is_null());
  std::filesystem::remove_all(dir);
}

TEST_CASE("a client that leaves mid-stream is logged as 499 on its rank", "[access-log]") {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  mock_engine engine(1, {"--itl-ms", "50"});
  dplb_proxy proxy(engine.urls(), {"--access-log", path.string()});
  {
    http_connection client(proxy.port());
    auto request = completion(true, "/v1/completions", 200);  // 10 s of tokens: it is cut short
    request.set(bhttp::field::host, "x");
    request.prepare_payload();
    std::ostringstream wire;
    wire << request;
    client.write_raw(wire.str());
    REQUIRE(client.read_for(300ms) > 0);  // the head and a few events
  }  // closed mid-stream
  const auto lines = await_lines(path, 1);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["rank"] == 0);
  CHECK(lines[0]["status"] == 499);
  CHECK(lines[0]["bytes"].get<std::uint64_t>() > 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("SIGHUP reopens the access log at its path after a rotation, and no log is written by default",
          "[access-log]") {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  mock_engine engine(1);
  {
    dplb_proxy quiet(engine.urls());
    REQUIRE(http_post_json(quiet.port(), "/v1/completions", completion(false).body()).status == 200);
    REQUIRE(quiet.process().stop(SIGTERM).has_value());
    // Everything it printed, to its exit: no access line.
    CHECK_FALSE(quiet.process().wait_for_line(std::regex("\"status\":"), 5s).has_value());
  }
  dplb_proxy proxy(engine.urls(), {"--access-log", path.string()});
  REQUIRE(http_post_json(proxy.port(), "/v1/completions", completion(false).body()).status == 200);
  REQUIRE(await_lines(path, 1).size() == 1);
  std::filesystem::rename(path, dir / "access.log.1");  // what logrotate does
  REQUIRE(::kill(proxy.process().pid(), SIGHUP) == 0);
  REQUIRE(proxy.process().wait_for_line(std::regex("access log reopened"), 10s).has_value());
  REQUIRE(http_post_json(proxy.port(), "/v1/completions", completion(false).body()).status == 200);
  CHECK(await_lines(path, 1).size() == 1);
  CHECK(read_lines(dir / "access.log.1").size() == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the access log path - writes the lines to standard output", "[access-log]") {
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--access-log", "-"});
  REQUIRE(http_post_json(proxy.port(), "/v1/completions?from=stdout", completion(false).body()).status == 200);
  const auto line = proxy.process().wait_for_line(std::regex(R"(\{"time":"[^"]+","rank":0,.*"path":"/v1/completions\?from=stdout")"), 10s);
  CHECK(line.has_value());
}

TEST_CASE("the access log keeps the client's X-Request-Id, the engine gets it made unique per request, and the client "
          "its own back",
          "[access-log]") {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  // Echoes the X-Request-Id it got, as vLLM does with --enable-request-id-headers.
  raw_engine engine([](const raw_request& r) {
    const std::string body = R"({"object":"text_completion","choices":[]})";
    return std::vector{write_bytes("HTTP/1.1 200 OK\r\nX-Request-Id: " + r.header("x-request-id").value_or("none") +
                                   "\r\nContent-Type: application/json\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n" + body)};
  });
  dplb_proxy proxy({engine.url()}, {"--health-check-interval-ms", "0", "--access-log", path.string()});
  http_connection first(proxy.port());
  http_connection second(proxy.port());
  for (auto* client : {&first, &second}) {  // two clients, one id
    auto r = completion(false);
    r.set("X-Request-Id", "shared-id");
    const auto answer = client->send(r);
    CHECK(answer.status == 200);
    CHECK(answer.headers.count("X-Request-Id") == 1);
    CHECK(answer.headers["X-Request-Id"] == "shared-id");
  }
  REQUIRE(engine.await_requests(2, 5s));
  const auto a = engine.requests().at(0).header_values("x-request-id");
  const auto b = engine.requests().at(1).header_values("x-request-id");
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  CHECK(a[0] != b[0]);
  CHECK(a[0].starts_with("shared-id-"));
  CHECK(b[0].starts_with("shared-id-"));
  // A request without one goes without one, as it came.
  http_connection third(proxy.port());
  CHECK(third.send(completion(false)).status == 200);
  REQUIRE(engine.await_requests(3, 5s));
  CHECK(engine.requests().at(2).header_values("x-request-id").empty());

  const auto lines = await_lines(path, 3);
  REQUIRE(lines.size() == 3);
  // (In any order: each line is written once its response is out, and the next request may be faster.)
  std::set<std::string> logged;
  int without_ids = 0;
  for (const auto& line : lines) {
    if (!line.contains("client_request_id")) {
      without_ids += line.contains("request_id") ? 0 : 1;
      continue;
    }
    CHECK(line["client_request_id"] == "shared-id");
    logged.insert(line["request_id"].get<std::string>());
  }
  CHECK(logged == std::set<std::string>{a[0], b[0]});
  CHECK(without_ids == 1);
  std::filesystem::remove_all(dir);
}
