// DP ranks behind one URL (`--backend URL#dp=N`) and pinning with X-data-parallel-rank: which engine
// server a request reaches, and which X-data-parallel-rank it carries there, read from the mock's echo
// of what it received.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using json = nlohmann::json;

namespace {

struct echoed {
  unsigned status = 0;
  std::uint16_t server_port = 0;               // which engine server answered (its Host line)
  std::vector<std::string> dp_rank_headers;    // every X-data-parallel-rank it received
  json error;                                  // for a refusal: the error object
};

// A request through dplb to the mock's echo endpoint, optionally pinned.
echoed echo_through(http_connection& client, const std::vector<std::string>& pins = {}) {
  bhttp::request<bhttp::string_body> request{bhttp::verb::post, "/mock/echo", 11};
  request.set(bhttp::field::content_type, "application/json");
  for (const auto& pin : pins) request.insert("X-data-parallel-rank", pin);
  request.body() = R"({"prompt":"x"})";
  const auto response = client.send(request);
  REQUIRE(response.complete);
  echoed out;
  out.status = response.status;
  const auto body = json::parse(response.body);
  if (response.status != 200) {
    out.error = body;
    return out;
  }
  for (const auto& h : body["headers"]) {
    const auto name = h[0].get<std::string>();
    if (boost::beast::iequals(name, "x-data-parallel-rank")) out.dp_rank_headers.push_back(h[1].get<std::string>());
    if (boost::beast::iequals(name, "host")) {
      const auto value = h[1].get<std::string>();
      out.server_port = static_cast<std::uint16_t>(std::stoi(value.substr(value.rfind(':') + 1)));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a #dp=N backend is N ranks that share its URL and are told apart by X-data-parallel-rank",
          "[dp]") {
  mock_engine engine(2);
  const auto urls = engine.urls();
  // Ranks 0 and 1 behind the first server, rank 2 the second one.
  dplb_proxy proxy({urls[0] + "#dp=2", urls[1]}, {"--policy", "round-robin", "--threads", "2"});
  http_connection client(proxy.port());
  for (int round = 0; round < 2; ++round) {
    const auto r0 = echo_through(client);
    const auto r1 = echo_through(client);
    const auto r2 = echo_through(client);
    CHECK(r0.server_port == engine.ports()[0]);
    CHECK(r0.dp_rank_headers == std::vector<std::string>{"0"});
    CHECK(r1.server_port == engine.ports()[0]);
    CHECK(r1.dp_rank_headers == std::vector<std::string>{"1"});
    // A plain backend never gets the header: a one-rank server refuses any value but its own.
    CHECK(r2.server_port == engine.ports()[1]);
    CHECK(r2.dp_rank_headers.empty());
  }
  // Metrics count global ranks.
  const auto metrics = parse_metrics(http_get(proxy.port(), "/metrics").body);
  for (const std::string rank : {"0", "1", "2"}) {
    INFO("rank " << rank);
    CHECK(metric_sum(metrics, "dplb_requests_total{", {"rank=\"" + rank + "\""}) == 2);
  }
}

TEST_CASE("X-data-parallel-rank pins a request to a global rank, which dplb rewrites for the engine", "[dp][pinned]") {
  mock_engine engine(2);
  const auto urls = engine.urls();
  dplb_proxy proxy({urls[0], urls[1] + "#dp=3"}, {"--policy", "least-inflight"});
  http_connection client(proxy.port());

  SECTION("a plain backend's rank: reached, and the client's header is not forwarded") {
    for (int i = 0; i < 3; ++i) {
      const auto r = echo_through(client, {"0"});
      CHECK(r.status == 200);
      CHECK(r.server_port == engine.ports()[0]);
      CHECK(r.dp_rank_headers.empty());
    }
  }
  SECTION("a #dp=N backend's rank: the engine gets the index inside its URL, once") {
    for (const auto& [global, local] : std::vector<std::pair<std::string, std::string>>{{"1", "0"}, {"3", "2"}, {"2", "1"}}) {
      INFO("global rank " << global);
      const auto r = echo_through(client, {global});
      CHECK(r.status == 200);
      CHECK(r.server_port == engine.ports()[1]);
      CHECK(r.dp_rank_headers == std::vector<std::string>{local});
    }
  }
  SECTION("out of range: 400 in OpenAI's error shape, never forwarded, and the connection stays usable") {
    for (const std::string bad : {"4", "-1", "99999999999999999999999"}) {
      INFO(bad);
      const auto r = echo_through(client, {bad});
      CHECK(r.status == 400);
      CHECK(r.error["error"]["type"] == "BadRequestError");
      CHECK(r.error["error"]["code"] == 400);
      CHECK_THAT(r.error["error"]["message"].get<std::string>(), Catch::Contains("X-data-parallel-rank"));
    }
    const auto metrics = parse_metrics(http_get(proxy.port(), "/metrics").body);
    CHECK(metric_sum(metrics, "dplb_requests_total{") == 0);
    CHECK(metric_sum(metrics, "dplb_rejected_requests_total{", {"code=\"400\""}) == 3);
    CHECK(echo_through(client).status == 200);
  }
  SECTION("not an integer: ignored, as vLLM ignores it, and not forwarded") {
    const auto r = echo_through(client, {"two"});
    CHECK(r.status == 200);
    CHECK(r.dp_rank_headers.size() <= 1);  // dplb's own, for a rank of the #dp=3 backend
  }
  SECTION("two headers that disagree: 400") {
    CHECK(echo_through(client, {"1", "2"}).status == 400);
    CHECK(echo_through(client, {"1", "1"}).status == 200);
  }
}
