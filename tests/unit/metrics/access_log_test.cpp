#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "dplb/metrics/access_log.hpp"

using dplb::metrics::access_entry;
using dplb::metrics::format_access_line;
using json = nlohmann::json;

TEST_CASE("an access line is one JSON object, with nulls where nothing is known", "[access-log]") {
  access_entry e;
  e.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(1'796'400'000'123));
  e.started = std::chrono::steady_clock::time_point(std::chrono::seconds(10));
  e.status = 413;
  e.bytes = 110;
  const auto text = format_access_line(e, e.started + std::chrono::milliseconds(250));
  CHECK(text.find('\n') == std::string::npos);
  const auto line = json::parse(text);
  CHECK(line["time"] == "2026-12-04T16:00:00.123Z");
  CHECK(line["status"] == 413);
  CHECK(line["bytes"] == 110);
  CHECK(line["duration"] == Approx(0.25));
  for (const char* key : {"rank", "method", "path", "ttfb", "tokens", "prompt_tokens", "completion_tokens", "model", "client"}) {
    INFO(key);
    CHECK(line[key].is_null());
  }
}

TEST_CASE("an access line escapes whatever the client sent, and sums the tokens", "[access-log]") {
  access_entry e;
  e.method = "POST";
  e.path = std::string("/v1/x?q=\"a\\b\"\x01\n\xc3\xa9\xff", 18);  // quotes, backslash, controls, UTF-8, a bad byte
  e.rank = 3;
  e.status = 200;
  e.ttfb = 0.0123456789;
  e.duration = 1.5;
  e.prompt_tokens = 20;
  e.completion_tokens = 7;
  e.model = "m\"odel";
  e.client = "[::1]:5000";
  const auto text = format_access_line(e, {});
  CHECK(text.find('\n') == std::string::npos);
  CHECK(text.find('\x01') == std::string::npos);
  const auto line = json::parse(text);
  CHECK(line["path"].get<std::string>().substr(0, 15) == "/v1/x?q=\"a\\b\"\x01\n");
  CHECK(line["rank"] == 3);
  CHECK(line["ttfb"] == Approx(0.012346));
  CHECK(line["duration"] == 1.5);
  CHECK(line["tokens"] == 27);
  CHECK(line["prompt_tokens"] == 20);
  CHECK(line["completion_tokens"] == 7);
  CHECK(line["model"] == "m\"odel");
  CHECK(line["client"] == "[::1]:5000");
  // The keys, in this order, as the documentation lists them.
  std::vector<std::string> keys;
  const auto ordered = nlohmann::ordered_json::parse(text);
  for (const auto& [key, value] : ordered.items()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"time", "rank", "method", "path", "status", "bytes", "ttfb", "duration",
                                         "tokens", "prompt_tokens", "completion_tokens", "model", "client", "tenant"});
}

TEST_CASE("an access line of a two-leg request adds its request id and its prefill leg, after the rest",
          "[access-log][pd]") {
  access_entry e;
  e.rank = 5;
  e.status = 200;
  e.duration = 0.9;
  e.request_id = "id-\"7\"-0123456789abcdef";
  e.client_request_id = "id-\"7\"";
  e.prefill_rank = 1;
  e.prefill_status = 200;
  e.prefill_duration = 0.25;
  const auto ordered = nlohmann::ordered_json::parse(format_access_line(e, {}));
  std::vector<std::string> keys;
  for (const auto& [key, value] : ordered.items()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"time", "rank", "method", "path", "status", "bytes", "ttfb", "duration",
                                         "tokens", "prompt_tokens", "completion_tokens", "model", "client",
                                         "tenant", "request_id", "client_request_id", "prefill_rank", "prefill_status",
                                         "prefill_duration"});
  CHECK(ordered["request_id"] == "id-\"7\"-0123456789abcdef");
  CHECK(ordered["client_request_id"] == "id-\"7\"");
  CHECK(ordered["prefill_rank"] == 1);
  CHECK(ordered["prefill_status"] == 200);
  CHECK(ordered["prefill_duration"] == 0.25);
  // A request that ran one leg (its prefill skipped) has its id alone; another request, none of them.
  e.prefill_rank.reset();
  const auto one_leg = json::parse(format_access_line(e, {}));
  CHECK(one_leg["request_id"] == "id-\"7\"-0123456789abcdef");
  CHECK_FALSE(one_leg.contains("prefill_rank"));
  e.client_request_id.clear();  // dplb made the id: the client sent none
  const auto made = json::parse(format_access_line(e, {}));
  CHECK(made["request_id"] == "id-\"7\"-0123456789abcdef");
  CHECK_FALSE(made.contains("client_request_id"));
  e.request_id.clear();
  CHECK_FALSE(json::parse(format_access_line(e, {})).contains("request_id"));
}
