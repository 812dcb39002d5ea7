// --tokenize engine's two pure halves: the /tokenize body made from a request's body (a text prompt, a
// batch's first prompt, or chat messages with the fields that change the template), and the ids read back.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "../../../src/server/prompt_tokens.hpp"

using dplb::server::tokenize_request_body;
using dplb::server::tokens_of_tokenize_answer;
using json = nlohmann::json;

TEST_CASE("tokenize body: a completions prompt, a batch's first prompt, or chat messages", "[tokenize]") {
  const auto text = tokenize_request_body(R"({"model":"m","prompt":"hello world","max_tokens":5,"stream":true})");
  REQUIRE(text);
  CHECK(json::parse(*text) == json{{"model", "m"}, {"prompt", "hello world"}});
  const auto batch = tokenize_request_body(R"({"model":"m","prompt":["first","second"],"add_special_tokens":false})");
  REQUIRE(batch);
  CHECK(json::parse(*batch) == json{{"model", "m"}, {"prompt", "first"}, {"add_special_tokens", false}});
  const auto chat = tokenize_request_body(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],)"
      R"("add_generation_prompt":false,"temperature":0.2,"chat_template_kwargs":{"x":1}})");
  REQUIRE(chat);
  CHECK(json::parse(*chat) == json{{"model", "m"},
                                   {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                                   {"tools", json::array({{{"type", "function"}}})},
                                   {"add_generation_prompt", false},
                                   {"chat_template_kwargs", {{"x", 1}}}});
}

TEST_CASE("tokenize body: nothing to ask for token ids, non-objects and bodies without a prompt", "[tokenize]") {
  CHECK_FALSE(tokenize_request_body(R"({"model":"m","prompt":[1,2,3]})"));
  CHECK_FALSE(tokenize_request_body(R"({"model":"m","prompt":[[1,2],[3]]})"));
  CHECK_FALSE(tokenize_request_body(R"({"model":"m"})"));
  CHECK_FALSE(tokenize_request_body(R"({"model":"m","messages":"not a list"})"));
  CHECK_FALSE(tokenize_request_body(R"([1,2])"));
  CHECK_FALSE(tokenize_request_body("{not json"));
}

TEST_CASE("tokenize answer: the ids, bounded, and anything else is no answer", "[tokenize]") {
  const auto ids = tokens_of_tokenize_answer(R"({"count":3,"max_model_len":8192,"tokens":[1,2,4294967295]})", 10);
  REQUIRE(ids);
  CHECK(*ids == std::vector<std::uint32_t>{1, 2, 4294967295u});
  CHECK(tokens_of_tokenize_answer(R"({"tokens":[1,2,3,4]})", 2) == std::vector<std::uint32_t>{1, 2});
  CHECK_FALSE(tokens_of_tokenize_answer(R"({"tokens":[1,-2]})", 10));
  CHECK_FALSE(tokens_of_tokenize_answer(R"({"tokens":[1,4294967296]})", 10));
  CHECK_FALSE(tokens_of_tokenize_answer(R"({"tokens":[1,"2"]})", 10));
  CHECK_FALSE(tokens_of_tokenize_answer(R"({"count":3})", 10));
  CHECK_FALSE(tokens_of_tokenize_answer(R"({"object":"error","message":"x"})", 10));
  CHECK_FALSE(tokens_of_tokenize_answer("<html>", 10));
}

TEST_CASE("tokenize body: a body nested too deep or too large is not sent", "[tokenize]") {
  // Deep nesting would make the tree's copy and dump recurse once per level: refused before parsing.
  const std::string deep = R"({"model":"m","messages":)" + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  CHECK_FALSE(tokenize_request_body(deep));
  // Brackets inside strings are text, not nesting.
  const std::string text_brackets = R"({"model":"m","prompt":")" + std::string(1'000, '[') + R"("})";
  CHECK(tokenize_request_body(text_brackets));
  const std::string large = R"({"model":"m","prompt":")" + std::string(dplb::server::max_tokenized_body_bytes, 'a') + R"("})";
  CHECK_FALSE(tokenize_request_body(large));
}
