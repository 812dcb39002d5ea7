// DP engines behind one port, the pure parts: X-data-parallel-rank and the port's balancing, the
// per-engine /metrics text, gauge overrides and the admin routes that set them.

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "admin_api.hpp"
#include "dp_routing.hpp"
#include "engine_metrics.hpp"
#include "metrics_override.hpp"
#include "rank_state.hpp"

using namespace dplb::mock;

namespace {

using wish = engine_wish;

bool names(const wish& w, unsigned engine) {
  const auto* named = std::get_if<unsigned>(&w);
  return named != nullptr && *named == engine;
}
bool any(const wish& w) { return std::holds_alternative<any_engine>(w); }
bool refused(const wish& w) { return std::holds_alternative<std::string>(w); }

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("dp: X-data-parallel-rank names an engine of an internal-LB port", "[dp]") {
  CHECK(names(read_dp_rank_header("0", 4, 0), 0));
  CHECK(names(read_dp_rank_header("3", 4, 0), 3));
  CHECK(names(read_dp_rank_header(" 2 ", 4, 7), 2));  // the port's rank does not matter with --dp > 1
  CHECK(names(read_dp_rank_header("+1", 4, 0), 1));   // as Python's int()
}

TEST_CASE("dp: an integer out of the port's range is refused", "[dp]") {
  for (const char* value : {"4", "-1", "99999999999999999999999", "-99999999999999999999999"}) {
    INFO(value);
    const auto w = read_dp_rank_header(value, 4, 0);
    REQUIRE(refused(w));
    CHECK(std::get<std::string>(w).find("X-data-parallel-rank") != std::string::npos);
  }
}

TEST_CASE("dp: no header, or one that is not an integer, leaves the choice to the port", "[dp]") {
  CHECK(any(read_dp_rank_header(std::nullopt, 4, 0)));
  for (const char* value : {"", " ", "one", "1.0", "1x", "0x1", "--1", "+", "1 2"}) {
    INFO(value);
    CHECK(any(read_dp_rank_header(value, 4, 0)));
    CHECK(any(read_dp_rank_header(value, 1, 3)));
  }
}

TEST_CASE("dp: with --dp 1 a port takes 0 or its own global rank, and refuses any other integer", "[dp]") {
  CHECK(names(read_dp_rank_header("0", 1, 0), 0));
  CHECK(names(read_dp_rank_header("0", 1, 2), 0));
  CHECK(names(read_dp_rank_header("2", 1, 2), 0));
  CHECK(refused(read_dp_rank_header("1", 1, 2)));
  CHECK(refused(read_dp_rank_header("1", 1, 0)));
  CHECK(refused(read_dp_rank_header("-2", 1, 2)));
}

TEST_CASE("dp: the port balances to the engine with the fewest requests in flight, ties to the lowest", "[dp]") {
  const auto pick = [](std::vector<int> loads) {
    return least_busy(static_cast<unsigned>(loads.size()), [&](unsigned j) { return loads[j]; });
  };
  CHECK(pick({0}) == 0);
  CHECK(pick({0, 0, 0}) == 0);
  CHECK(pick({1, 0, 0}) == 1);
  CHECK(pick({2, 1, 1}) == 1);
  CHECK(pick({3, 2, 1}) == 2);
  CHECK(pick({1, 1, 0, 0}) == 2);
}

TEST_CASE("dp: /metrics of a port of N engines has every vLLM series once per engine", "[dp][metrics]") {
  rank_state port(1, 3, 3);
  port.engines[0].metrics.requests_running = 2;
  port.engines[1].metrics.requests_waiting = 5;
  port.engines[2].metrics.requests_routed = 7;
  port.metrics.connections_accepted = 4;
  const auto text = port_metrics_text(port, "m");
  for (const char* family : {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                             "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                             "vllm:request_success_total"}) {
    INFO(family);
    CHECK(count(text, std::string("# TYPE ") + family + " ") == 1);  // one family...
    CHECK(count(text, std::string("\n") + family + "{") == 3);       // ... with one sample per engine
  }
  CHECK(text.find("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n") != std::string::npos);
  CHECK(text.find("vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0.0\n") != std::string::npos);
  CHECK(text.find("vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 5.0\n") != std::string::npos);
  CHECK(text.find("vllm:kv_cache_usage_perc{engine=\"2\",model_name=\"m\"} 0.0\n") != std::string::npos);
  CHECK(text.find("vllm:request_success_total{engine=\"2\",finished_reason=\"length\",model_name=\"m\"} 0.0\n") !=
        std::string::npos);
  CHECK(text.find("mock_requests_routed_total{engine=\"2\"} 7.0\n") != std::string::npos);
  // The port's own series count the port, not an engine: no label.
  CHECK(text.find("\nmock_connections_accepted_total 4.0\n") != std::string::npos);
}

TEST_CASE("dp: with --dp 1 the one engine keeps the port's rank as its label", "[dp][metrics]") {
  rank_state port(2, 1, 2);
  port.metrics.connections_accepted = 1;
  const auto text = port_metrics_text(port, "m");
  CHECK(text.find("vllm:num_requests_running{engine=\"2\",model_name=\"m\"} 0.0\n") != std::string::npos);
  CHECK(text.find("mock_connections_accepted_total{engine=\"2\"} 1.0\n") != std::string::npos);
  CHECK(text.find("engine=\"0\"") == std::string::npos);
  CHECK(text.find("mock_steps_total") == std::string::npos);  // only with --simulate
}

TEST_CASE("dp: gauge overrides replace an engine's reported values until cleared", "[dp][metrics]") {
  rank_state port(0, 2, 0);
  port.engines[1].metrics.requests_running = 1;
  port.engines[1].metrics.kv_cache_usage = 0.25;
  auto text = port_metrics_text(port, "m");
  CHECK(text.find("vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.25\n") != std::string::npos);

  const auto patch = parse_gauge_override_patch(R"({"running":5,"waiting":7,"kv_cache_usage":0.9})");
  REQUIRE(std::holds_alternative<gauge_override_patch>(patch));
  port.engines[1].overrides.store(patched({}, std::get<gauge_override_patch>(patch)));
  text = port_metrics_text(port, "m");
  CHECK(text.find("vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 5.0\n") != std::string::npos);
  CHECK(text.find("vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 7.0\n") != std::string::npos);
  CHECK(text.find("vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.9\n") != std::string::npos);
  CHECK(text.find("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0\n") != std::string::npos);

  // A subset changes only its fields; null goes back to the real value.
  const auto partial = parse_gauge_override_patch(R"({"running":null})");
  REQUIRE(std::holds_alternative<gauge_override_patch>(partial));
  const auto after = patched(port.engines[1].overrides.load(), std::get<gauge_override_patch>(partial));
  CHECK(render_gauge_overrides(after) == R"({"running":null,"waiting":7,"kv_cache_usage":0.9})");
  port.engines[1].overrides.store(after);
  text = port_metrics_text(port, "m");
  CHECK(text.find("vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 1.0\n") != std::string::npos);
}

TEST_CASE("dp: bad override bodies are refused", "[dp][admin]") {
  for (const char* body : {"[]", "{", R"({"running":-1})", R"({"running":1.5})", R"({"waiting":true})",
                           R"({"kv_cache_usage":"x"})", R"({"kv_cache_usage":-0.1})", R"({"engine":1})"}) {
    INFO(body);
    CHECK(std::holds_alternative<std::string>(parse_gauge_override_patch(body)));
  }
  CHECK(std::holds_alternative<gauge_override_patch>(parse_gauge_override_patch("")));
}

TEST_CASE("dp: raw metrics text replaces the rendered one exactly", "[dp][metrics]") {
  rank_state port(0, 2, 0);
  port.raw_metrics.store(std::string("vllm:num_requests_running{engine=\"0\"} NaN\ngarbage"));
  CHECK(port_metrics_text(port, "m") == "vllm:num_requests_running{engine=\"0\"} NaN\ngarbage");
  port.raw_metrics.store(std::nullopt);
  CHECK(port_metrics_text(port, "m").find("# TYPE vllm:num_requests_running gauge") != std::string::npos);
}

TEST_CASE("dp: the admin routes for overrides, raw text and stats", "[dp][admin]") {
  const auto parse = [](std::string_view method, std::string_view target, std::string_view body = {}) {
    return parse_admin_request(method, target, body, 2, 4);
  };
  auto set = parse("POST", "/metrics/override?rank=1&engine=3", R"({"waiting":2})");
  REQUIRE(std::holds_alternative<admin_command>(set));
  CHECK(std::get<admin_command>(set).action == admin_action::set_override);
  CHECK(std::get<admin_command>(set).rank == 1);
  CHECK(std::get<admin_command>(set).engine == 3);
  CHECK(std::get<admin_command>(set).override_patch.waiting == std::optional<std::optional<std::int64_t>>(2));

  const auto status = [&](std::string_view method, std::string_view target, std::string_view body = {}) {
    const auto parsed = parse(method, target, body);
    return std::holds_alternative<admin_answer>(parsed) ? std::get<admin_answer>(parsed).status : 0U;
  };
  CHECK(status("POST", "/metrics/override?rank=1&engine=4", "{}") == 400);
  CHECK(status("POST", "/metrics/override?rank=2&engine=0", "{}") == 400);
  CHECK(status("POST", "/metrics/override?rank=0", "{}") == 400);
  CHECK(status("POST", "/metrics/override?rank=0&engine=0", R"({"running":"5"})") == 400);
  CHECK(status("PUT", "/metrics/override") == 405);
  CHECK(status("GET", "/metrics/override?rank=0&engine=1") == 0);
  CHECK(status("DELETE", "/metrics/override") == 0);  // every engine of every port: no rank needed
  CHECK(status("GET", "/metrics/raw?rank=0") == 405);
  CHECK(status("DELETE", "/metrics/raw?rank=1") == 0);
  CHECK(status("POST", "/stats") == 405);
  CHECK(status("GET", "/stats") == 0);
  CHECK(status("GET", "/metrics?rank=1") == 0);  // the existing routes stay
  CHECK(status("GET", "/fault?rank=2") == 400);

  const auto raw = parse("POST", "/metrics/raw?rank=1", "not prometheus");
  REQUIRE(std::holds_alternative<admin_command>(raw));
  CHECK(std::get<admin_command>(raw).raw_metrics == "not prometheus");
}

TEST_CASE("dp: /stats lists per port and engine the requests routed and the recent requests", "[dp][admin]") {
  std::deque<rank_state> ranks;
  ranks.emplace_back(0, 2, 0);
  ranks[0].engines[1].metrics.requests_routed = 3;
  ranks[0].engines[1].metrics.requests_routed_by_header = 2;
  ranks[0].log({1U, std::string("1")});
  ranks[0].log({std::nullopt, std::string("9")});
  ranks[0].log({0U, std::nullopt});
  CHECK(render_stats(ranks, {8100}) ==
        R"({"ports":[{"rank":0,"port":8100,"engines":[)"
        R"({"engine":0,"requests_routed":0,"requests_routed_by_header":0,"requests_in_flight":0},)"
        R"({"engine":1,"requests_routed":3,"requests_routed_by_header":2,"requests_in_flight":0}],)"
        R"("recent":[{"engine":1,"x_data_parallel_rank":"1"},{"engine":null,"x_data_parallel_rank":"9"},)"
        R"({"engine":0,"x_data_parallel_rank":null}]}]})");
}

namespace {

// The oracle's pick for per-engine (cached blocks, in flight), with --load-bound `bound`.
unsigned oracle(std::vector<engine_outlook> engines, double bound = 1.25) {
  return choose_by_cached_prefix(engines, bound);
}

}  // namespace

TEST_CASE("dp oracle: the load ceiling is ceil(C * (total in flight + 1) / N)", "[dp][oracle]") {
  CHECK(in_flight_ceiling(0, 4, 1.25) == 1);   // 0.3125
  CHECK(in_flight_ceiling(3, 4, 1.25) == 2);   // 1.25
  CHECK(in_flight_ceiling(7, 4, 1.0) == 2);    // exactly 2: not rounded up past it
  CHECK(in_flight_ceiling(9, 11, 1.1) == 1);   // 1.1 * 10 / 11 is 1.0000000000000002 in doubles
  CHECK(in_flight_ceiling(15, 4, 2.0) == 8);
}

TEST_CASE("dp oracle: the longest cached prefix wins among the engines within the bound", "[dp][oracle]") {
  CHECK(oracle({{0, 0}, {3, 0}, {5, 0}, {1, 0}}) == 2);
  CHECK(oracle({{2, 1}, {7, 1}, {0, 1}, {0, 1}}) == 1);  // ceiling ceil(1.25 * 5 / 4) = 2: all allowed
  // Engine 2 holds the most but would go above the ceiling (1 + 1 > ceil(1.25 * 2 / 4) = 1): the
  // longest match among the others.
  CHECK(oracle({{0, 0}, {3, 0}, {9, 1}, {0, 0}}) == 1);
  // A looser bound lets it take the request after all (ceil(2 * 2 / 4) = 1 still refuses, 4 allows).
  CHECK(oracle({{0, 0}, {3, 0}, {9, 1}, {0, 0}}, 2.0) == 1);
  CHECK(oracle({{0, 0}, {3, 0}, {9, 1}, {0, 0}}, 4.0) == 2);
}

TEST_CASE("dp oracle: equal matches go to the fewest in flight, then the lowest index", "[dp][oracle]") {
  CHECK(oracle({{4, 2}, {4, 1}, {4, 2}, {0, 0}}, 2.0) == 1);
  CHECK(oracle({{0, 0}, {4, 1}, {4, 1}, {0, 0}}, 2.0) == 1);
  CHECK(oracle({{0, 3}, {4, 0}, {4, 0}, {0, 0}}) == 1);
}

TEST_CASE("dp oracle: with no match of a block among the allowed engines, the least busy engine", "[dp][oracle]") {
  CHECK(oracle({{0, 0}, {0, 0}, {0, 0}}) == 0);  // as least-inflight: the lowest index on a tie
  CHECK(oracle({{0, 2}, {0, 1}, {0, 1}, {0, 3}}) == 1);
  CHECK(oracle({{0, 1}, {0, 1}, {6, 2}, {0, 0}}) == 3);  // the match is on an engine above the ceiling
  CHECK(oracle({{0, 1}, {0, 1}, {6, 2}, {0, 2}}, 1.0) == 0);  // 2 + 1 > ceil(7 / 4)
  CHECK(oracle({{0, 1}, {0, 1}, {6, 2}, {0, 2}}) == 2);       // 2 + 1 <= ceil(1.25 * 7 / 4)
  // The least busy engine is always within the bound, even with C = 1.
  for (std::int64_t a = 0; a < 6; ++a) {
    for (std::int64_t b = 0; b < 6; ++b) {
      const std::vector<engine_outlook> engines{{0, a}, {0, b}, {0, 1}};
      const auto j = choose_by_cached_prefix(engines, 1.0);
      CHECK(engines[j].in_flight + 1 <= in_flight_ceiling(a + b + 1, 3, 1.0));
    }
  }
}

TEST_CASE("dp oracle: one engine takes everything", "[dp][oracle]") {
  CHECK(oracle({{0, 5}}) == 0);
  CHECK(oracle({{3, 5}}, 1.0) == 0);
}
