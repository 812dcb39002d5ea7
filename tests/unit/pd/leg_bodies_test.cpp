// The two legs' bodies of prefill/decode disaggregation, as vLLM's disaggregated proxy builds them: the
// prefill leg asks for a remote decode of a 1-token, non-streaming answer; the decode leg is the client's body
// byte for byte plus the prefill answer's kv_transfer_params, verbatim.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "dplb/pd/leg_bodies.hpp"
#include "dplb/support/json_text.hpp"

using json = nlohmann::json;
using namespace dplb;

TEST_CASE("prefill leg: kv_transfer_params for a remote decode, stream off, one token", "[pd]") {
  const auto body = pd::prefill_body(
      R"({"model":"m","prompt":"hi","max_tokens":64,"stream":true,"stream_options":{"include_usage":true},)"
      R"("min_tokens":4,"temperature":0.5})");
  REQUIRE(body);
  const auto j = json::parse(*body);
  CHECK(j["model"] == "m");
  CHECK(j["prompt"] == "hi");
  CHECK(j["temperature"] == 0.5);
  CHECK(j["stream"] == false);
  CHECK(j["max_tokens"] == 1);
  CHECK_FALSE(j.contains("max_completion_tokens"));  // only when the client gave that key
  CHECK_FALSE(j.contains("stream_options"));
  CHECK_FALSE(j.contains("min_tokens"));
  CHECK(j["kv_transfer_params"] == json{{"do_remote_decode", true}, {"do_remote_prefill", false},
                                        {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                        {"remote_host", nullptr}, {"remote_port", nullptr}});
  // The client's keys keep their order.
  CHECK(body->find("\"model\"") < body->find("\"prompt\""));

  const auto chat = pd::prefill_body(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":99,"min_completion_tokens":3})");
  REQUIRE(chat);
  const auto c = json::parse(*chat);
  CHECK(c["max_completion_tokens"] == 1);
  CHECK(c["max_tokens"] == 1);
  CHECK_FALSE(c.contains("min_completion_tokens"));
  CHECK(c["stream"] == false);  // set whatever the client sent, or nothing
}

TEST_CASE("prefill leg: a body that is not a JSON object, or nests too deep, gets none", "[pd]") {
  CHECK_FALSE(pd::prefill_body("[1,2]"));
  CHECK_FALSE(pd::prefill_body("{\"prompt\":"));
  CHECK_FALSE(pd::prefill_body(""));
  CHECK_FALSE(pd::prefill_body(R"({"x":)" + std::string(1'000, '[') + std::string(1'000, ']') + "}"));
  // A byte order mark before the object: JSON parsers take it or not, and the decode body could not follow.
  CHECK_FALSE(pd::prefill_body("\xEF\xBB\xBF{\"prompt\":\"p\"}"));
  CHECK(pd::prefill_body(" \r\n{\"prompt\":\"p\"} \n"));
}

TEST_CASE("decode leg: the client's body byte for byte plus the prefill answer's kv_transfer_params verbatim", "[pd]") {
  const std::string answer =
      R"({"id":"cmpl-1","choices":[{"text":"x"}],"kv_transfer_params": {"do_remote_prefill":true,)"
      R"("remote_block_ids":[1,2,3],"remote_engine_id":"e-9","remote_port":5600,"tp_size":1,"z":1.50} ,"usage":{}})";
  const auto params = pd::kv_transfer_params_of(answer);
  REQUIRE(params);
  CHECK(*params == R"({"do_remote_prefill":true,"remote_block_ids":[1,2,3],"remote_engine_id":"e-9","remote_port":5600,"tp_size":1,"z":1.50})");
  const std::string client = R"({ "model": "m", "prompt": "hi", "stream": true } )";
  const auto body = pd::decode_body(client, *params);
  REQUIRE(body);
  CHECK(*body == R"({ "model": "m", "prompt": "hi", "stream": true ,"kv_transfer_params":)" + std::string(*params) + "} ");
  CHECK(json::parse(*body)["kv_transfer_params"]["z"] == 1.5);
  CHECK(pd::decode_body("{}", "{}") == std::optional<std::string>(R"({"kv_transfer_params":{}})"));
  // A client's own kv_transfer_params is replaced, not doubled.
  const auto replaced = pd::decode_body(R"({"kv_transfer_params":{"evil":1},"prompt":"p"})", *params);
  REQUIRE(replaced);
  const auto r = json::parse(*replaced);
  CHECK(r["kv_transfer_params"]["remote_engine_id"] == "e-9");
  CHECK_FALSE(r["kv_transfer_params"].contains("evil"));
  CHECK(r["prompt"] == "p");
}

TEST_CASE("decode leg: no kv_transfer_params object in the prefill answer means no decode leg", "[pd]") {
  CHECK_FALSE(pd::kv_transfer_params_of(R"({"choices":[]})"));
  CHECK_FALSE(pd::kv_transfer_params_of(R"({"kv_transfer_params":null})"));
  CHECK_FALSE(pd::kv_transfer_params_of(R"({"kv_transfer_params":[1]})"));
  CHECK_FALSE(pd::kv_transfer_params_of(R"({"a":"kv_transfer_params","b":{"kv_transfer_params":{}}})"));  // not top level
  CHECK_FALSE(pd::kv_transfer_params_of("not json"));
  CHECK_FALSE(pd::decode_body("[]", "{}"));
}

TEST_CASE("json text: nesting depth and a top-level member's raw value", "[pd][json-text]") {
  CHECK(support::json_nesting_depth(R"({"a":[{"b":"[[[["}]})", 100) == 3);
  CHECK(support::json_nesting_depth(std::string(500, '['), 10) == 11);  // stops past the limit
  CHECK(support::json_member_text(R"({"a":1,"b":"x\"}","c":[1,{"d":2}]})", "c") == std::optional<std::string_view>("[1,{\"d\":2}]"));
  CHECK(support::json_member_text(R"({"a":1,"b":"x\"}","c":[1,{"d":2}]})", "b") == std::optional<std::string_view>(R"("x\"}")"));
  CHECK(support::json_member_text(R"( { "a" : true } )", "a") == std::optional<std::string_view>("true"));
  CHECK_FALSE(support::json_member_text(R"({"a":1})", "b"));
  CHECK_FALSE(support::json_member_text(R"({"a":[1,)", "a"));
  CHECK_FALSE(support::json_member_text(R"([{"a":1}])", "a"));
}

TEST_CASE("client body: a top-level kv_transfer_params is found however the engines' JSON reader would read it",
          "[pd]") {
  using pd::sets_kv_transfer_params;
  CHECK(sets_kv_transfer_params(R"({"model":"m","kv_transfer_params":{"do_remote_prefill":true}})"));
  CHECK(sets_kv_transfer_params(R"( { "kv_transfer_params" : null } )"));
  // Spelled with escapes, as Python's json decodes them.
  CHECK(sets_kv_transfer_params(R"({"kv_transfer_p\u0061rams":{}})"));
  CHECK(sets_kv_transfer_params(R"({"\u006B\u0076_transfer_params":{}})"));
  CHECK(sets_kv_transfer_params(R"({"kv_transfer\/params":1})") == false);  // "kv_transfer/params": another key
  // A duplicate key after others, after values of every kind (Python keeps the last of duplicates).
  CHECK(sets_kv_transfer_params(
      R"({"a":"x\"}","b":[1,{"kv_transfer_params":2}],"c":NaN,"d":-Infinity,"kv_transfer_params":{"x":1}})"));
  CHECK(sets_kv_transfer_params("\xEF\xBB\xBF{\"kv_transfer_params\":{}}"));  // after a UTF-8 byte order mark
  // UTF-16 and UTF-32, which Python's json reads and the scan does not.
  CHECK(sets_kv_transfer_params(std::string("{\0\"\0", 4)));
  CHECK(sets_kv_transfer_params("\xFF\xFE{\0"));
  // Not at the top level, not a key, or no JSON object: the client's own business.
  CHECK_FALSE(sets_kv_transfer_params(R"({"messages":[{"kv_transfer_params":{}}]})"));
  CHECK_FALSE(sets_kv_transfer_params(R"({"prompt":"kv_transfer_params","extra":{"kv_transfer_params":1}})"));
  CHECK_FALSE(sets_kv_transfer_params(R"({"kv_transfer_params_x":1,"xkv_transfer_params":2})"));
  CHECK_FALSE(sets_kv_transfer_params(R"({"kv_transfer_p\u0061ram":1})"));
  CHECK_FALSE(sets_kv_transfer_params(R"([{"kv_transfer_params":{}}])"));
  CHECK_FALSE(sets_kv_transfer_params(""));
  CHECK_FALSE(sets_kv_transfer_params("prompt=kv_transfer_params"));
  CHECK_FALSE(sets_kv_transfer_params(R"({"a":1 "kv_transfer_params":{}})"));  // unreadable to any JSON reader
}
