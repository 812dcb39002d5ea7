// Prefill/decode disaggregation's pure parts: kv_transfer_params as requests carry them, the prefill
// answer's object, the pull's bodies, and the hold table (read once, expiry, the metrics it keeps).

#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "engine_metrics.hpp"
#include "kv_transfer.hpp"
#include "openai_api.hpp"

using namespace dplb::mock;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

std::variant<generation_request, api_error> parse_completion(const json& body, bool read_kv_transfer = true) {
  return parse_generation_request(api_kind::completions, "application/json", body.dump(), "mock-model", 16, 0,
                                  false, read_kv_transfer);
}

const json leg1_params = {{"do_remote_decode", true}, {"do_remote_prefill", false}, {"remote_engine_id", nullptr},
                          {"remote_block_ids", nullptr}, {"remote_host", nullptr}, {"remote_port", nullptr}};

const json leg2_params = {{"do_remote_prefill", true},      {"do_remote_decode", false},
                          {"remote_block_ids", {3, 4}},     {"remote_engine_id", "mock-1-0"},
                          {"remote_request_id", "r-kv0"},   {"remote_host", "127.0.0.1"},
                          {"remote_port", 8100},            {"tp_size", 1}};

}  // namespace

TEST_CASE("kv transfer: leg 1's params, all nulls but do_remote_decode, are read", "[kv_transfer]") {
  const auto parsed = parse_completion({{"prompt", "a b"}, {"max_tokens", 1}, {"kv_transfer_params", leg1_params}});
  REQUIRE(std::holds_alternative<generation_request>(parsed));
  const auto& kv = std::get<generation_request>(parsed).kv_transfer;
  REQUIRE(kv);
  CHECK(kv->do_remote_decode);
  CHECK_FALSE(kv->do_remote_prefill);
  CHECK(kv->remote_engine_id.empty());
  CHECK(kv->remote_block_ids.empty());
}

TEST_CASE("kv transfer: leg 2's params are read whole", "[kv_transfer]") {
  const auto parsed = parse_completion({{"prompt", "a b"}, {"kv_transfer_params", leg2_params}});
  REQUIRE(std::holds_alternative<generation_request>(parsed));
  const auto& kv = std::get<generation_request>(parsed).kv_transfer;
  REQUIRE(kv);
  CHECK(kv->do_remote_prefill);
  CHECK(kv->remote_engine_id == "mock-1-0");
  CHECK(kv->remote_request_id == "r-kv0");
  CHECK(kv->remote_host == "127.0.0.1");
  CHECK(kv->remote_port == 8100);
  CHECK(kv->remote_block_ids == std::vector<std::uint64_t>{3, 4});
  // The answer's object gives the same JSON back (the router passes it on verbatim).
  CHECK(json::parse(kv_transfer_answer(*kv).dump()) == leg2_params);
}

TEST_CASE("kv transfer: absent or null params are none, and none are read unless asked for", "[kv_transfer]") {
  for (const auto& body : {json{{"prompt", "a"}}, json{{"prompt", "a"}, {"kv_transfer_params", nullptr}}}) {
    const auto parsed = parse_completion(body);
    REQUIRE(std::holds_alternative<generation_request>(parsed));
    CHECK_FALSE(std::get<generation_request>(parsed).kv_transfer);
  }
  // --kv-role both: not even a malformed object is looked at.
  const auto parsed = parse_completion({{"prompt", "a"}, {"kv_transfer_params", 5}}, false);
  REQUIRE(std::holds_alternative<generation_request>(parsed));
  CHECK_FALSE(std::get<generation_request>(parsed).kv_transfer);
}

TEST_CASE("kv transfer: malformed params get vLLM's 400", "[kv_transfer]") {
  auto missing_host = leg2_params;
  missing_host["remote_host"] = nullptr;
  for (const auto& params :
       {json(5), json{{"do_remote_decode", "yes"}}, json{{"remote_port", 70000}}, json{{"remote_block_ids", {"x"}}},
        json{{"remote_engine_id", 3}}, missing_host}) {
    INFO(params.dump());
    const auto parsed = parse_completion({{"prompt", "a"}, {"kv_transfer_params", params}});
    REQUIRE(std::holds_alternative<api_error>(parsed));
    const auto& error = std::get<api_error>(parsed);
    CHECK(error.status == 400);
    const auto body = json::parse(error.body);
    CHECK(body["error"]["type"] == "BadRequestError");
    CHECK(body["error"]["message"].get<std::string>().find("kv_transfer_params") != std::string::npos);
  }
}

TEST_CASE("kv transfer: a prefill answer carries kv_transfer_params at its top level", "[kv_transfer]") {
  kv_transfer_params held;
  held.do_remote_prefill = true;
  held.remote_engine_id = "mock-7-1";
  held.remote_request_id = "abc-kv0";
  held.remote_block_ids = {0, 1};
  held.remote_host = "127.0.0.1";
  held.remote_port = 9000;
  for (const auto kind : {api_kind::completions, api_kind::chat}) {
    const response_renderer renderer(kind, "abc", 0, "mock-model");
    const auto body = json::parse(renderer.full_response(3, 1, &held));
    CHECK(body["kv_transfer_params"] ==
          json{{"do_remote_prefill", true}, {"do_remote_decode", false}, {"remote_block_ids", {0, 1}},
               {"remote_engine_id", "mock-7-1"}, {"remote_request_id", "abc-kv0"}, {"remote_host", "127.0.0.1"},
               {"remote_port", 9000}, {"tp_size", 1}});
    CHECK_FALSE(json::parse(renderer.full_response(3, 1)).contains("kv_transfer_params"));
  }
}

TEST_CASE("kv transfer: one block per started block of prompt tokens, at least one", "[kv_transfer]") {
  CHECK(blocks_for(0, 16) == 1);
  CHECK(blocks_for(1, 16) == 1);
  CHECK(blocks_for(16, 16) == 1);
  CHECK(blocks_for(17, 16) == 2);
  CHECK(blocks_for(64, 16) == 4);
}

TEST_CASE("kv transfer: the pull's bodies", "[kv_transfer]") {
  const auto body = render_kv_pull_request({"mock-1-0", "r-kv0"});
  CHECK(json::parse(body) == json{{"remote_engine_id", "mock-1-0"}, {"remote_request_id", "r-kv0"}});
  const auto parsed = parse_kv_pull_request(body);
  REQUIRE(std::holds_alternative<kv_pull_request>(parsed));
  CHECK(std::get<kv_pull_request>(parsed).remote_request_id == "r-kv0");
  CHECK(std::holds_alternative<std::string>(parse_kv_pull_request("{}")));
  CHECK(std::holds_alternative<std::string>(parse_kv_pull_request("nope")));
  CHECK(std::holds_alternative<std::string>(parse_kv_pull_request(R"({"remote_engine_id":1,"remote_request_id":"r"})")));

  const auto answer = render_kv_pulled({3, 40});
  CHECK(json::parse(answer) == json{{"blocks", 3}, {"prompt_tokens", 40}});
  const auto pulled = parse_kv_pulled(answer);
  REQUIRE(pulled);
  CHECK(pulled->blocks == 3);
  CHECK(pulled->prompt_tokens == 40);
  CHECK_FALSE(parse_kv_pulled(R"({"blocks":-1,"prompt_tokens":2})"));
}

TEST_CASE("kv hold table: a hold is read once, by its engine and request id", "[kv_transfer]") {
  kv_hold_table table(1000ms);
  engine_metrics metrics;
  const auto t0 = kv_hold_table::clock::time_point{} + 1h;
  const auto a = table.hold("mock-1-0", "req", 3, 40, &metrics, t0);
  const auto b = table.hold("mock-1-0", "req", 1, 5, &metrics, t0);
  CHECK(a.do_remote_prefill);
  CHECK_FALSE(a.do_remote_decode);
  CHECK(a.remote_engine_id == "mock-1-0");
  CHECK(a.remote_request_id != b.remote_request_id);  // one X-Request-Id, two prefills: two holds
  CHECK(a.remote_request_id.rfind("req-", 0) == 0);
  CHECK(a.remote_block_ids.size() == 3);
  CHECK(b.remote_block_ids.size() == 1);
  CHECK(b.remote_block_ids.front() != a.remote_block_ids.front());
  CHECK(table.blocks_held() == 4);
  CHECK(metrics.kv_blocks_held == 4);

  CHECK_FALSE(table.take("mock-1-1", a.remote_request_id));  // another engine's id: not this hold
  const auto pulled = table.take("mock-1-0", a.remote_request_id);
  REQUIRE(pulled);
  CHECK(pulled->blocks == 3);
  CHECK(pulled->prompt_tokens == 40);
  CHECK_FALSE(table.take("mock-1-0", a.remote_request_id));  // read once
  CHECK(table.blocks_held() == 1);
  CHECK(metrics.kv_blocks_held == 1);
  CHECK(metrics.kv_holds_expired == 0);
}

TEST_CASE("kv hold table: an unread hold expires at its deadline, and is gone", "[kv_transfer]") {
  kv_hold_table table(1000ms);
  engine_metrics metrics;
  const auto t0 = kv_hold_table::clock::time_point{} + 1h;
  const auto early = table.hold("e", "early", 2, 20, &metrics, t0);
  const auto late = table.hold("e", "late", 5, 70, &metrics, t0 + 500ms);
  CHECK(table.expire(t0 + 999ms) == 0);
  CHECK(table.expire(t0 + 1000ms) == 1);
  CHECK(table.size() == 1);
  CHECK(metrics.kv_blocks_held == 5);
  CHECK(metrics.kv_holds_expired == 1);
  CHECK_FALSE(table.take("e", early.remote_request_id));
  REQUIRE(table.take("e", late.remote_request_id));
  CHECK(table.expire(t0 + 10s) == 0);  // read before its deadline: nothing left to expire
  CHECK(metrics.kv_blocks_held == 0);
  CHECK(metrics.kv_holds_expired == 1);
  CHECK(table.blocks_held() == 0);
}

TEST_CASE("kv hold table: a hold's release runs once, when it is taken or expires, outside the lock",
          "[kv_transfer]") {
  kv_hold_table table(1000ms);
  const auto t0 = kv_hold_table::clock::time_point{} + 1h;
  int taken_released = 0;
  int expired_released = 0;
  // The release may use the table again (it runs outside its lock).
  const auto taken = table.hold("e", "taken", 3, 40, nullptr, t0, [&] {
    ++taken_released;
    CHECK(table.size() == 1);
  });
  table.hold("e", "expired", 2, 20, nullptr, t0, [&] {
    ++expired_released;
    CHECK(table.blocks_held() == 0);
  });
  CHECK_FALSE(table.take("e", "nope"));
  CHECK(taken_released == 0);
  REQUIRE(table.take("e", taken.remote_request_id));
  CHECK(taken_released == 1);
  CHECK_FALSE(table.take("e", taken.remote_request_id));
  CHECK(taken_released == 1);
  CHECK(table.expire(t0 + 999ms) == 0);
  CHECK(expired_released == 0);
  CHECK(table.expire(t0 + 1000ms) == 1);
  CHECK(expired_released == 1);
  CHECK(table.expire(t0 + 2000ms) == 0);
  CHECK(expired_released == 1);
}
