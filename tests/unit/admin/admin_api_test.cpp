// The admin API's handlers without sockets: authentication (Bearer, and Basic for browsers, with the
// cross-site check), routing (404, 405 with Allow), the status page's files and headers, the /ranks document
// with its per-rank outcome counters, drains by rank and by backend URL (normalised as --backend is),
// runtime weights, and the draining gauge.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <boost/asio/ip/address.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dplb/admin/admin_api.hpp"
#include "dplb/admin/status_page.hpp"
#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/backend_registry.hpp"
#include "dplb/upstream/health_monitor.hpp"

namespace admin = dplb::admin;
using dplb::balancer::rank_flag;
using json = nlohmann::json;

namespace {

const std::string token = "s3cret-token";
const std::string bearer = "Bearer " + token;

// RFC 4648 base64, with padding: what a browser sends in `Authorization: Basic`.
std::string base64(std::string_view bytes) {
  constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    std::uint32_t group = 0;
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    for (std::size_t k = 0; k < 3; ++k) group = (group << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (std::size_t k = 0; k < 4; ++k) out += k <= n ? alphabet[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

std::string basic(std::string_view user, std::string_view password) {
  return "Basic " + base64(std::string(user) + ":" + std::string(password));
}

// Two backends: http://127.0.0.1:8100#dp=2 (ranks 0 and 1) and http://engine-b:8101 (rank 2).
std::unique_ptr<dplb::upstream::topology> two_backends() {
  auto t = std::make_unique<dplb::upstream::topology>(16);
  dplb::upstream::backend a;
  a.url = "http://127.0.0.1:8100";
  a.dp = 2;
  t->add(std::move(a), 1);
  dplb::upstream::backend b;
  b.url = "http://engine-b:8101";
  t->add(std::move(b), 1);
  return t;
}

boost::asio::ip::address asio_address(const char* text) { return boost::asio::ip::make_address(text); }

// Adds without a name lookup: the admin API's part is what is tested here, not the resolver's.
dplb::upstream::backend unresolved(const dplb::config::backend_spec& spec) {
  dplb::upstream::backend b;
  b.url = spec.url;
  b.dp = spec.dp;
  return b;
}

struct fixture {
  std::unique_ptr<dplb::upstream::topology> topology_storage = two_backends();
  dplb::upstream::topology& topology = *topology_storage;
  dplb::balancer::balancer balancer{3, dplb::balancer::make_policy("round-robin"), {}, {}, topology.capacity()};
  dplb::metrics::proxy_metrics metrics{{"http://127.0.0.1:8100", "http://127.0.0.1:8100", "http://engine-b:8101"},
                                       balancer, "round-robin", topology.capacity()};
  dplb::upstream::health_monitor health{topology, balancer, metrics, {.interval = std::chrono::milliseconds(0), .policy = {}}};
  bool engines_moved = false;  // from now on, every backend resolves to another address
  dplb::upstream::backend_registry registry{topology, balancer, metrics, health, {"default"},
                                            [this](const dplb::config::backend_spec& spec) {
                                              auto b = unresolved(spec);
                                              if (engines_moved) b.endpoints.emplace_back(asio_address("10.0.0.9"), 80);
                                              return b;
                                            }};
  admin::admin_api api{registry, token};

  admin::response call(std::string_view method, std::string_view target, std::string_view body = {},
                       std::string_view authorization = bearer) const {
    return api.handle({method, target, authorization, body});
  }
};

json body_of(const admin::response& r) { return json::parse(r.body); }

// The values of every header `name` of the answer, in order.
std::vector<std::string> headers_of(const admin::response& r, std::string_view name) {
  std::vector<std::string> values;
  for (const auto& h : r.headers) {
    if (h.name == name) values.push_back(h.value);
  }
  return values;
}

const std::vector<std::string> bearer_challenge{"Bearer"};
const std::vector<std::string> basic_then_bearer{R"(Basic realm="dplb admin", charset="UTF-8")", "Bearer"};

void check_error(const admin::response& r, unsigned status) {
  CHECK(r.status == status);
  const auto body = body_of(r);
  CHECK(body["error"]["code"] == status);
  CHECK(body["error"]["message"].is_string());
}

}  // namespace

TEST_CASE("admin requests without the right token get 401 with a challenge", "[admin]") {
  fixture f;
  for (const std::string& auth :
       {std::string(), std::string("Bearer"), std::string("Bearer "), "Bearer " + token + "x",
        "Bearer " + token.substr(1), "Basic " + token, std::string("Bearer S3CRET-TOKEN"), token,
        basic("admin", token + "x"), basic(token, ""), basic(token, "admin"), "Basic " + base64(token),
        basic("admin", "S3CRET-TOKEN"), "Basic " + base64("admin:" + token) + "!", "Bearer " + base64(":" + token)}) {
    INFO("Authorization: " << auth);
    const auto r = f.call("GET", "/ranks", {}, auth);
    check_error(r, 401);
    CHECK(headers_of(r, "WWW-Authenticate") == bearer_challenge);  // API paths: as before, Bearer only
    CHECK(body_of(r)["error"]["type"] == "AuthenticationError");
  }
  // Before routing: an unknown path or a drain says nothing, and changes nothing, without the token.
  check_error(f.call("GET", "/nope", {}, "Bearer wrong"), 401);
  check_error(f.call("POST", "/ranks/0/drain", {}, ""), 401);
  CHECK(f.balancer.flags(0) == 0);
  // The scheme is case-insensitive, the token is not.
  CHECK(f.call("GET", "/ranks", {}, "bearer " + token).status == 200);
  CHECK(f.call("GET", "/ranks").headers.empty());
}

TEST_CASE("Basic credentials with the token as the password open the API as the bearer token does", "[admin]") {
  fixture f;
  // Any user name, an empty one included; the scheme in any case.
  for (const std::string& auth : {basic("admin", token), basic("", token), "basic " + base64("x:" + token),
                                  "BASIC " + base64("x:" + token) + " "}) {
    INFO("Authorization: " << auth);
    CHECK(f.call("GET", "/ranks", {}, auth).status == 200);
  }
  // A password with colons: the user name ends at the first one.
  admin::admin_api colons{f.registry, "a:b:c"};
  CHECK(colons.handle({"GET", "/ranks", basic("u", "a:b:c"), {}}).status == 200);
  CHECK(colons.handle({"GET", "/ranks", basic("u", "a:b"), {}}).status == 401);
  CHECK(colons.handle({"GET", "/ranks", "Basic " + base64("a:b:c"), {}}).status == 401);  // user "a", password "b:c"
  // Changes too, from tools (no Origin) and from the listener's own page (Origin = http://Host).
  const auto drained = f.call("POST", "/ranks/0/drain", {}, basic("admin", token));
  REQUIRE(drained.status == 200);
  CHECK(f.balancer.flags(0) == rank_flag::draining);
  const auto undrained = f.api.handle({"POST", "/ranks/0/undrain", basic("admin", token), {}, "http://127.0.0.1:8001",
                                       "127.0.0.1:8001"});
  REQUIRE(undrained.status == 200);
  CHECK(f.balancer.flags(0) == 0);
}

TEST_CASE("a change with Basic credentials asked by another origin's page is refused", "[admin]") {
  fixture f;
  // A browser attaches the Basic credentials it holds to a form another site posts here: refused, and
  // nothing changes. Reading is allowed (the other page cannot read the answer).
  for (const std::string_view origin :
       {"http://evil.example", "null", "http://127.0.0.1:8002", "https://127.0.0.1:8001"}) {
    INFO("Origin: " << origin);
    const auto r = f.api.handle({"POST", "/ranks/0/drain", basic("admin", token), {}, origin, "127.0.0.1:8001"});
    check_error(r, 403);
    CHECK(f.balancer.flags(0) == 0);
    CHECK(f.api.handle({"PUT", "/ranks/0/weight", basic("admin", token), R"({"weight":5})", origin, "127.0.0.1:8001"})
              .status == 403);
    CHECK(f.balancer.weight(0) == 1);
    CHECK(f.api.handle({"GET", "/ranks", basic("admin", token), {}, origin, "127.0.0.1:8001"}).status == 200);
    // A browser never sends a Bearer header by itself: the token in it was given on purpose.
    CHECK(f.api.handle({"POST", "/ranks/0/drain", bearer, {}, origin, "127.0.0.1:8001"}).status == 200);
    REQUIRE(f.call("POST", "/ranks/0/undrain").status == 200);
  }
  // Without a Host to compare with, an Origin is foreign.
  CHECK(f.api.handle({"POST", "/ranks/0/drain", basic("admin", token), {}, "http://127.0.0.1:8001", {}}).status == 403);
}

TEST_CASE("basic_password decodes RFC 7617 credentials and nothing else", "[admin]") {
  CHECK(admin::basic_password("Basic YWRtaW46czNjcmV0LXRva2Vu") == "s3cret-token");  // admin:s3cret-token
  CHECK(admin::basic_password("Basic OnM=") == "s");                                  // ":s", unpadded below
  CHECK(admin::basic_password("Basic OnM") == "s");
  CHECK(admin::basic_password("Basic dTo=") == "");  // "u:", an empty password
  CHECK(admin::basic_password("basic " + base64("u:p:q")) == "p:q");
  CHECK(admin::basic_password("Basic " + base64(std::string("u:\xff\x00x", 5))) == std::string("\xff\x00x", 3));
  CHECK_FALSE(admin::basic_password("Basic " + base64("no colon")));
  CHECK_FALSE(admin::basic_password("Basic YWRta W46cw=="));  // a space inside
  CHECK_FALSE(admin::basic_password("Basic YWRtaW46c-=="));  // not the alphabet
  CHECK_FALSE(admin::basic_password("Basic YWRtaW46c"));  // a length no encoding has (4n + 1)
  CHECK_FALSE(admin::basic_password("Basic ==="));
  CHECK_FALSE(admin::basic_password("Basic "));
  CHECK_FALSE(admin::basic_password("Bearer " + base64("u:p")));
  CHECK_FALSE(admin::basic_password("Basicx" + base64("u:p")));
  CHECK_FALSE(admin::basic_password(""));
}

TEST_CASE("GET / serves the status page, with Bearer or Basic credentials, and its own security headers", "[admin]") {
  fixture f;
  for (const std::string& auth : {bearer, basic("admin", token)}) {
    INFO("Authorization: " << auth);
    const auto r = f.call("GET", "/", {}, auth);
    REQUIRE(r.status == 200);
    CHECK(r.content_type == "text/html; charset=utf-8");
    CHECK_THAT(r.body, Catch::StartsWith("<!doctype html>") && Catch::Contains(R"(<meta name="viewport")") &&
                           Catch::Contains(R"(<script src="/status.js")") && Catch::Contains(R"(href="/status.css")"));
    CHECK(headers_of(r, "Content-Security-Policy") == std::vector<std::string>{std::string(admin::status_page_csp)});
    CHECK(headers_of(r, "X-Frame-Options") == std::vector<std::string>{"DENY"});
    CHECK(headers_of(r, "WWW-Authenticate").empty());
    CHECK(f.call("GET", "/?refresh=1", {}, auth).body == r.body);
  }
  // The CSP allows no inline code and nothing from elsewhere.
  CHECK_THAT(std::string(admin::status_page_csp),
             Catch::StartsWith("default-src 'none'; ") && Catch::Contains("script-src 'self';") &&
                 Catch::Contains("connect-src 'self';") && !Catch::Contains("unsafe") && !Catch::Contains("http"));
  const auto js = f.call("GET", "/status.js");
  REQUIRE(js.status == 200);
  CHECK(js.content_type == "text/javascript; charset=utf-8");
  CHECK_THAT(js.body,
             Catch::Contains("new URL('/ranks', location.origin)") && Catch::Contains("fetch(RANKS_URL") &&
                 Catch::Contains("textContent") && !Catch::Contains("innerHTML"));
  const auto css = f.call("GET", "/status.css");
  REQUIRE(css.status == 200);
  CHECK(css.content_type == "text/css; charset=utf-8");
  CHECK_THAT(css.body, Catch::Contains("@media (max-width:"));
  // Every file of the page is served, and nothing in it is fetched from elsewhere.
  REQUIRE(admin::status_page_assets().size() == 3);
  for (const auto& asset : admin::status_page_assets()) {
    INFO(asset.path);
    CHECK(f.call("GET", asset.path).body == asset.body);
    CHECK_THAT(std::string(asset.body), !Catch::Contains("http://") && !Catch::Contains("https://") &&
                                            !Catch::Contains("//cdn"));
  }
}

TEST_CASE("the status page without credentials asks the browser for Basic ones", "[admin]") {
  fixture f;
  for (const std::string& auth : {std::string(), basic("admin", "wrong"), std::string("Bearer wrong")}) {
    for (const char* path : {"/", "/status.js", "/status.css"}) {
      INFO("GET " << path << " with Authorization: " << auth);
      const auto r = f.call("GET", path, {}, auth);
      check_error(r, 401);
      CHECK(r.content_type == "application/json");
      CHECK(headers_of(r, "WWW-Authenticate") == basic_then_bearer);
      CHECK(headers_of(r, "Content-Security-Policy").empty());
    }
  }
}

TEST_CASE("the status page answers only GET", "[admin]") {
  fixture f;
  for (const char* method : {"POST", "PUT", "DELETE", "HEAD"}) {
    INFO(method);
    const auto r = f.call(method, "/");
    check_error(r, 405);
    CHECK(r.allow == "GET");
    check_error(f.call(method, "/", {}, ""), 401);  // authentication first, as on every path
  }
}

TEST_CASE("GET /ranks counts each rank's responses, server errors and failed attempts", "[admin]") {
  fixture f;
  using namespace std::chrono_literals;
  f.metrics.request_finished(0, 200, 10ms);
  f.metrics.request_finished(0, 404, 10ms);  // the client's mistake, not the rank's
  f.metrics.request_finished(0, 499, 10ms);  // the client left
  f.metrics.request_finished(2, 500, 10ms);
  f.metrics.request_finished(2, 502, 10ms);
  f.metrics.request_finished(2, 503, 10ms);
  f.metrics.request_finished(2, 504, 10ms);
  f.metrics.request_finished(2, 200, 10ms);
  f.metrics.upstream_error(2, "reset");
  f.metrics.upstream_error(2, "connect");
  f.metrics.upstream_error(1, "timeout");
  f.metrics.rejected(503);  // dplb's own refusal: no rank's

  const auto doc = body_of(f.call("GET", "/ranks"));
  const auto& r0 = doc["ranks"][0];
  CHECK(r0["responses_total"] == 3);
  CHECK(r0["errors_total"] == 0);
  CHECK(r0["upstream_errors_total"] == 0);
  const auto& r1 = doc["ranks"][1];
  CHECK(r1["responses_total"] == 0);
  CHECK(r1["errors_total"] == 0);
  CHECK(r1["upstream_errors_total"] == 1);
  const auto& r2 = doc["ranks"][2];
  CHECK(r2["responses_total"] == 5);
  CHECK(r2["errors_total"] == 4);
  CHECK(r2["upstream_errors_total"] == 2);
  // The same counters drive a rank's object in every answer.
  CHECK(body_of(f.call("POST", "/ranks/2/drain"))["errors_total"] == 4);
}

TEST_CASE("GET /ranks tells dplb's version, uptime and in-flight skew", "[admin]") {
  fixture f;
  auto doc = body_of(f.call("GET", "/ranks"));
  CHECK(doc["version"] == DPLB_VERSION);
  CHECK(doc["uptime_seconds"].is_number());
  CHECK(doc["uptime_seconds"].get<double>() >= 0);
  CHECK(doc["uptime_seconds"].get<double>() < 60);
  CHECK(doc["inflight_skew"] == 0);
  auto a = f.balancer.acquire();
  auto b = f.balancer.acquire();
  auto c = f.balancer.acquire();
  auto d = f.balancer.acquire();  // round-robin over 3 ranks: one of them has 2
  REQUIRE(d);
  doc = body_of(f.call("GET", "/ranks"));
  CHECK(doc["inflight_skew"] == 1);
}

TEST_CASE("a token set again (SIGHUP) replaces the old one at once", "[admin]") {
  fixture f;
  REQUIRE(f.call("GET", "/ranks").status == 200);
  f.api.set_token("the-next-token");
  check_error(f.call("GET", "/ranks"), 401);
  CHECK(f.call("GET", "/ranks", {}, "Bearer the-next-token").status == 200);
  CHECK(f.call("GET", "/ranks", {}, basic("admin", "the-next-token")).status == 200);
}

TEST_CASE("GET /ranks lists every rank with its backend, state and load", "[admin]") {
  fixture f;
  f.balancer.set_weight(2, 3);
  f.balancer.set_flag(1, rank_flag::unhealthy, true);
  auto lease = f.balancer.acquire({}, {10, 5});
  REQUIRE(lease);
  const auto held = lease.rank();

  const auto r = f.call("GET", "/ranks");
  REQUIRE(r.status == 200);
  const auto doc = body_of(r);
  CHECK(doc["policy"] == "round-robin");
  REQUIRE(doc["ranks"].size() == 3);
  const auto& r0 = doc["ranks"][0];
  CHECK(r0["rank"] == 0);
  CHECK(r0["url"] == "http://127.0.0.1:8100");
  CHECK(r0["index_in_url"] == 0);
  CHECK(r0["dp"] == 2);
  CHECK(r0["weight"] == 1);
  CHECK(r0["flags"] == json::array());
  CHECK(r0["usable"] == true);
  CHECK(r0["engine"].is_null());  // never read
  const auto& r1 = doc["ranks"][1];
  CHECK(r1["url"] == "http://127.0.0.1:8100");
  CHECK(r1["index_in_url"] == 1);
  CHECK(r1["flags"] == json::array({"unhealthy"}));
  CHECK(r1["usable"] == false);
  const auto& r2 = doc["ranks"][2];
  CHECK(r2["url"] == "http://engine-b:8101");
  CHECK(r2["dp"] == 1);
  CHECK(r2["weight"] == 3);
  const auto& busy = doc["ranks"][held];
  CHECK(busy["inflight"] == 1);
  CHECK(busy["requests_total"] == 1);
  CHECK(busy["tokens_inflight"] == 15);
}

TEST_CASE("GET /ranks shows the engine's numbers once read", "[admin]") {
  fixture f;
  std::vector<dplb::balancer::engine_reading> round(3);
  round[2].good = true;
  round[2].load = {4, 7, 0.25};
  round[2].read_at = std::chrono::steady_clock::now();
  f.balancer.publish_engine_stats(round);
  const auto doc = body_of(f.call("GET", "/ranks"));
  const auto& engine = doc["ranks"][2]["engine"];
  CHECK(engine["waiting"] == 4);
  CHECK(engine["running"] == 7);
  CHECK(engine["kv_cache_usage"] == 0.25);
  CHECK(engine["age_seconds"].get<double>() >= 0);
  CHECK(doc["ranks"][0]["engine"].is_null());
}

TEST_CASE("draining a rank sets only its draining flag and gauge, and undraining clears them", "[admin]") {
  fixture f;
  f.balancer.set_flag(1, rank_flag::unhealthy, true);
  auto r = f.call("POST", "/ranks/1/drain");
  REQUIRE(r.status == 200);
  auto doc = body_of(r);
  CHECK(doc["rank"] == 1);
  CHECK(doc["flags"] == json::array({"unhealthy", "draining"}));
  CHECK(f.balancer.flags(1) == (rank_flag::unhealthy | rank_flag::draining));
  CHECK(f.balancer.flags(0) == 0);
  CHECK_THAT(f.metrics.render(), Catch::Contains("dplb_rank_draining{rank=\"1\"} 1"));
  CHECK_THAT(f.metrics.render(), Catch::Contains("dplb_rank_draining{rank=\"0\"} 0"));

  // The health checks clearing their bit leave the drain in place.
  f.balancer.set_flag(1, rank_flag::unhealthy, false);
  CHECK(f.balancer.flags(1) == rank_flag::draining);
  for (int i = 0; i < 6; ++i) CHECK(f.balancer.acquire().rank() != 1);

  r = f.call("POST", "/ranks/1/undrain");
  REQUIRE(r.status == 200);
  CHECK(body_of(r)["flags"] == json::array());
  CHECK(body_of(r)["usable"] == true);
  CHECK(f.balancer.flags(1) == 0);
  CHECK_THAT(f.metrics.render(), Catch::Contains("dplb_rank_draining{rank=\"1\"} 0"));
}

TEST_CASE("an unknown or malformed rank is 404", "[admin]") {
  fixture f;
  for (const char* target : {"/ranks/3/drain", "/ranks/-1/drain", "/ranks/+1/drain", "/ranks/1x/drain",
                             "/ranks/99999999999999999999999/drain"}) {
    INFO(target);
    check_error(f.call("POST", target), 404);
  }
  check_error(f.call("PUT", "/ranks/3/weight", R"({"weight":2})"), 404);
}

TEST_CASE("backends are drained by their URL, normalised as --backend normalises it", "[admin]") {
  fixture f;
  auto r = f.call("POST", "/backends/drain", R"({"url":"http://127.0.0.1:8100/"})");
  REQUIRE(r.status == 200);
  auto doc = body_of(r);
  CHECK(doc["url"] == "http://127.0.0.1:8100");
  REQUIRE(doc["ranks"].size() == 2);
  CHECK(doc["ranks"][0]["rank"] == 0);
  CHECK(doc["ranks"][1]["rank"] == 1);
  CHECK(f.balancer.flags(0) == rank_flag::draining);
  CHECK(f.balancer.flags(1) == rank_flag::draining);
  CHECK(f.balancer.flags(2) == 0);

  // Upper-case host, default port spelled out elsewhere: the same engine.
  r = f.call("POST", "/backends/drain", R"({"url":"http://ENGINE-B:8101"})");
  REQUIRE(r.status == 200);
  CHECK(f.balancer.flags(2) == rank_flag::draining);
  CHECK_FALSE(f.balancer.any_usable());

  r = f.call("POST", "/backends/undrain", R"({"url":"http://127.0.0.1:8100"})");
  REQUIRE(r.status == 200);
  CHECK(f.balancer.flags(0) == 0);
  CHECK(f.balancer.flags(1) == 0);
  CHECK(f.balancer.flags(2) == rank_flag::draining);
}

TEST_CASE("backend drains refuse unknown URLs with 404 and bad bodies with 400", "[admin]") {
  fixture f;
  check_error(f.call("POST", "/backends/drain", R"({"url":"http://127.0.0.1:9999"})"), 404);
  check_error(f.call("POST", "/backends/drain", R"({"url":"http://127.0.0.1"})"), 404);  // port 80
  for (const char* body : {"", "not json", "[]", "{}", R"({"url":8100})", R"({"url":"ftp://h:1"})",
                           R"({"url":"http://127.0.0.1:8100#dp=2"})"}) {
    INFO(body);
    check_error(f.call("POST", "/backends/drain", body), 400);
  }
  for (std::size_t r = 0; r < 3; ++r) CHECK(f.balancer.flags(r) == 0);
}

TEST_CASE("PUT /ranks/{rank}/weight sets the weight within the --backend bounds", "[admin]") {
  fixture f;
  auto r = f.call("PUT", "/ranks/2/weight", R"({"weight": 10000})");
  REQUIRE(r.status == 200);
  CHECK(body_of(r)["weight"] == 10000);
  CHECK(f.balancer.weight(2) == 10000);
  r = f.call("PUT", "/ranks/2/weight", R"({"weight": 1})");
  REQUIRE(r.status == 200);
  CHECK(f.balancer.weight(2) == 1);
  for (const char* body : {R"({"weight": 0})", R"({"weight": 10001})", R"({"weight": -2})", R"({"weight": 2.5})",
                           R"({"weight": "2"})", R"({})", "2"}) {
    INFO(body);
    check_error(f.call("PUT", "/ranks/2/weight", body), 400);
  }
  CHECK(f.balancer.weight(2) == 1);
}

TEST_CASE("unknown admin paths are 404 and known paths with a wrong method 405 with Allow", "[admin]") {
  fixture f;
  for (const char* target : {"/index.html", "/status.html", "/rank", "/ranks/", "/ranks/0", "/ranks/0/drain/now", "/backends/x", "/v1/models"}) {
    INFO(target);
    check_error(f.call("GET", target), 404);
  }
  auto r = f.call("POST", "/ranks");
  check_error(r, 405);
  CHECK(r.allow == "GET");
  r = f.call("GET", "/ranks/0/drain");
  check_error(r, 405);
  CHECK(r.allow == "POST");
  r = f.call("POST", "/ranks/0/weight", R"({"weight":2})");
  check_error(r, 405);
  CHECK(r.allow == "PUT");
  CHECK(f.balancer.weight(0) == 1);
  r = f.call("DELETE", "/backends");
  check_error(r, 405);
  CHECK(r.allow == "GET, POST");
  // A query string does not change the route.
  CHECK(f.call("GET", "/ranks?verbose=1").status == 200);
}

TEST_CASE("a backend added at runtime gets the next ranks, and removed it takes nothing new and leaves once idle",
          "[admin]") {
  fixture f;
  auto added = f.call("POST", "/backends", R"({"url": "http://127.0.0.1:8102/#dp=2&weight=3"})");
  REQUIRE(added.status == 201);
  auto doc = body_of(added);
  CHECK(doc["url"] == "http://127.0.0.1:8102");
  CHECK(doc["state"] == "active");
  REQUIRE(doc["ranks"].size() == 2);
  CHECK(doc["ranks"][0]["rank"] == 3);
  CHECK(doc["ranks"][1]["rank"] == 4);
  CHECK(doc["ranks"][1]["weight"] == 3);
  CHECK(f.balancer.rank_count() == 5);
  CHECK(f.topology.ranks()[4].request_lines.find("X-data-parallel-rank: 1\r\n") != std::string::npos);
  CHECK_THAT(f.metrics.render(), Catch::Contains(R"(dplb_rank_inflight{rank="4",url="http://127.0.0.1:8102"})"));
  // Served already: refused, whatever the dp.
  check_error(f.call("POST", "/backends", R"({"url": "http://127.0.0.1:8102#dp=2"})"), 409);
  check_error(f.call("POST", "/backends", R"({"url": "http://127.0.0.1:8102"})"), 409);
  check_error(f.call("POST", "/backends", R"({"url": "ftp://x"})"), 400);
  check_error(f.call("POST", "/backends", R"({"url": "http://127.0.0.1:8109", "cluster": "nope"})"), 400);
  CHECK(doc["cluster"] == "default");
  CHECK(f.balancer.rank_count() == 5);

  // Rank 3 has a request in flight when its backend is removed.
  dplb::balancer::pick_context pinned;
  pinned.pinned_rank = 3;
  auto lease = f.balancer.acquire(pinned);
  REQUIRE(lease);
  auto removed = f.call("POST", "/backends/remove", R"({"url": "http://127.0.0.1:8102"})");
  REQUIRE(removed.status == 202);
  doc = body_of(removed);
  CHECK(doc["state"] == "removing");
  CHECK(doc["ranks"][0]["flags"] == json::array({"removed"}));
  CHECK(doc["ranks"][0]["inflight"] == 1);
  for (int i = 0; i < 30; ++i) {
    auto l = f.balancer.acquire();
    REQUIRE(l);
    CHECK(l.rank() < 3);
  }
  CHECK_FALSE(f.balancer.acquire(pinned));
  CHECK(f.registry.retire_drained().empty());  // still in flight
  CHECK_THAT(f.metrics.render(), Catch::Contains(R"(rank="3")"));
  lease.release();
  CHECK(f.registry.retire_drained() == std::vector<std::string>{"http://127.0.0.1:8102"});
  CHECK_THAT(f.metrics.render(), !Catch::Contains(R"(rank="3")") && !Catch::Contains(R"(rank="4")"));
  CHECK(body_of(f.call("GET", "/backends"))["backends"].size() == 2);
  CHECK(body_of(f.call("GET", "/ranks"))["ranks"][3]["backend_state"] == "removed");
  check_error(f.call("POST", "/backends/remove", R"({"url": "http://127.0.0.1:8102"})"), 404);

  // Added back with the same dp: the same ranks, usable again, in the metrics again.
  added = f.call("POST", "/backends", R"({"url": "http://127.0.0.1:8102#dp=2"})");
  REQUIRE(added.status == 201);
  doc = body_of(added);
  CHECK(doc["ranks"][0]["rank"] == 3);
  CHECK(doc["ranks"][0]["flags"] == json::array());
  CHECK(doc["ranks"][0]["weight"] == 1);
  CHECK(f.balancer.rank_count() == 5);
  CHECK(f.balancer.acquire(pinned));
  CHECK_THAT(f.metrics.render(), Catch::Contains(R"(dplb_rank_inflight{rank="3")"));
}

TEST_CASE("a removed backend with nothing in flight leaves at once, and bad removals are refused", "[admin]") {
  fixture f;
  const auto removed = f.call("POST", "/backends/remove", R"({"url": "http://engine-b:8101"})");
  REQUIRE(removed.status == 200);
  CHECK(body_of(removed)["state"] == "removed");
  CHECK_FALSE(f.balancer.usable(2));
  check_error(f.call("POST", "/backends/remove", R"({"url": "http://engine-b:8101#dp=1"})"), 400);
  check_error(f.call("POST", "/backends/remove", R"({"link": "http://engine-b:8101"})"), 400);
  check_error(f.call("POST", "/backends/remove", "not json"), 400);
  // No room: the topology of this fixture holds 16 ranks over its life.
  const auto full = f.call("POST", "/backends", R"({"url": "http://127.0.0.1:8103#dp=14"})");
  check_error(full, 507);
  CHECK_THAT(body_of(full)["error"]["message"].get<std::string>(), Catch::Contains("at most 16"));
  CHECK(f.balancer.rank_count() == 3);
}

TEST_CASE("a reload makes the active backends match the configuration", "[admin][reload]") {
  fixture f;
  const auto spec = [](std::string text) {
    dplb::config::backend_spec s;
    REQUIRE(dplb::config::parse_backend(text, s).empty());
    return s;
  };
  // Rank 0 and 1's backend stays with a new weight; engine-b goes; a new backend comes.
  const auto summary = f.registry.reload({spec("http://127.0.0.1:8100#dp=2&weight=2"), spec("http://127.0.0.1:8104")});
  CHECK(summary.reweighted == std::vector<std::string>{"http://127.0.0.1:8100"});
  CHECK(summary.removed == std::vector<std::string>{"http://engine-b:8101"});
  CHECK(summary.added == std::vector<std::string>{"http://127.0.0.1:8104"});
  CHECK(f.balancer.weight(0) == 2);
  CHECK(f.balancer.weight(1) == 2);
  CHECK(f.balancer.flags(2) == rank_flag::removed);
  CHECK(f.balancer.rank_count() == 4);
  CHECK(f.balancer.usable(3));
  // A dp change is a new set of ranks: the old ones go, new ones come.
  const auto again = f.registry.reload({spec("http://127.0.0.1:8100#dp=3&weight=2"), spec("http://127.0.0.1:8104")});
  CHECK(again.removed == std::vector<std::string>{"http://127.0.0.1:8100"});
  CHECK(again.added == std::vector<std::string>{"http://127.0.0.1:8100"});
  CHECK(f.balancer.rank_count() == 7);
  CHECK(f.balancer.flags(0) == rank_flag::removed);
  CHECK(f.balancer.usable(6));
  // Nothing changed: nothing done.
  const auto same = f.registry.reload({spec("http://127.0.0.1:8100#dp=3&weight=2"), spec("http://127.0.0.1:8104")});
  CHECK(same.added.empty());
  CHECK(same.removed.empty());
  CHECK(same.reweighted.empty());
}

TEST_CASE("a backend added back is resolved again: at another address it gets new ranks", "[admin]") {
  fixture f;
  REQUIRE(f.call("POST", "/backends/remove", R"({"url": "http://engine-b:8101"})").status == 200);
  // Same addresses: back under rank 2.
  auto back = f.call("POST", "/backends", R"({"url": "http://engine-b:8101"})");
  REQUIRE(back.status == 201);
  CHECK(body_of(back)["ranks"][0]["rank"] == 2);
  REQUIRE(f.call("POST", "/backends/remove", R"({"url": "http://engine-b:8101"})").status == 200);
  // The engine moved (a rescheduled pod): new ranks, and the old one stays removed.
  f.engines_moved = true;
  back = f.call("POST", "/backends", R"({"url": "http://engine-b:8101"})");
  REQUIRE(back.status == 201);
  CHECK(body_of(back)["ranks"][0]["rank"] == 3);
  CHECK(f.topology.backends()[2].endpoints.size() == 1);
  CHECK(f.balancer.flags(2) == rank_flag::removed);
  CHECK(f.balancer.usable(3));
}

TEST_CASE("a reload that cannot add a backend changes nothing", "[admin][reload]") {
  fixture f;
  dplb::upstream::backend_registry strict{f.topology, f.balancer, f.metrics, f.health, {"default"},
                                          [](const dplb::config::backend_spec& spec) -> dplb::upstream::backend {
                                            if (spec.url == "http://nowhere:1") throw dplb::config::config_error("cannot resolve");
                                            return unresolved(spec);
                                          }};
  dplb::config::backend_spec good, bad;
  REQUIRE(dplb::config::parse_backend("http://127.0.0.1:8105", good).empty());
  REQUIRE(dplb::config::parse_backend("http://nowhere:1", bad).empty());
  // engine-b would go, 8105 would come, but nowhere:1 cannot be added: nothing happens.
  try {
    strict.reload({good, bad});
    FAIL("the reload should have been refused");
  } catch (const dplb::upstream::backend_change_error& e) {
    CHECK(e.status() == 400);
  }
  CHECK(f.balancer.rank_count() == 3);
  for (std::size_t r = 0; r < 3; ++r) CHECK(f.balancer.usable(r));
}
