#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <algorithm>
#include <string>
#include <vector>

#include "dplb/balancer/prefix_index.hpp"
#include "dplb/server/request_facts.hpp"

using dplb::server::inspect_request_body;
using dplb::server::request_facts;

namespace {

constexpr auto u32_max = std::numeric_limits<std::uint32_t>::max();

}  // namespace

TEST_CASE("a vllm bench serve completions body", "[request-facts]") {
  const std::string prompt(4096, 'x');
  const auto f = inspect_request_body(R"({"model": "meta-llama/Llama-3.1-8B", "prompt": ")" + prompt + R"(",
    "max_tokens": 128, "stream": true, "stream_options": {"include_usage": true}})");
  CHECK(f.json_object);
  CHECK(f.model == "meta-llama/Llama-3.1-8B");
  CHECK(f.prompt_tokens == 1024);
  CHECK_FALSE(f.prompt_tokens_exact);
  CHECK(f.max_tokens == 128u);
  CHECK(f.choices == 1);
  CHECK_FALSE(f.data_parallel_rank);
}

TEST_CASE("the estimate is ceil(bytes / 4) per string", "[request-facts]") {
  CHECK(inspect_request_body(R"({"prompt": ""})").prompt_tokens == 0);
  CHECK(inspect_request_body(R"({"prompt": "a"})").prompt_tokens == 1);
  CHECK(inspect_request_body(R"({"prompt": "abcd"})").prompt_tokens == 1);
  CHECK(inspect_request_body(R"({"prompt": "abcde"})").prompt_tokens == 2);
  // A batch: each prompt is tokenized on its own, so each is rounded up on its own.
  const auto batch = inspect_request_body(R"({"prompt": ["a", "abcde", "abcdefgh"]})");
  CHECK(batch.prompt_tokens == 1 + 2 + 2);
  CHECK_FALSE(batch.prompt_tokens_exact);
}

TEST_CASE("strings are counted after unescaping, in UTF-8 bytes", "[request-facts]") {
  // `\"` is one byte of text; \u00e9 (é) two bytes; \ud83d\ude00 (an emoji) four; 日本 six.
  CHECK(inspect_request_body(R"({"prompt": "\"\"\"\""})").prompt_tokens == 1);
  CHECK(inspect_request_body(R"({"prompt": "\u00e9\u00e9\u00e9"})").prompt_tokens == 2);
  CHECK(inspect_request_body(R"({"prompt": "\ud83d\ude00"})").prompt_tokens == 1);
  CHECK(inspect_request_body("{\"prompt\": \"\xe6\x97\xa5\xe6\x9c\xac\"}").prompt_tokens == 2);
  // An escaped quote does not end the string: the key after it inside the text is text.
  const auto f = inspect_request_body(R"({"prompt": "say \"model\": \"x\", \"n\": 5", "model": "m"})");
  CHECK(f.model == "m");
  CHECK(f.choices == 1);
}

TEST_CASE("a prompt of token ids is counted exactly", "[request-facts]") {
  const auto ids = inspect_request_body(R"({"prompt": [1, 2, 3, 4, 5], "model": "m"})");
  CHECK(ids.prompt_tokens == 5);
  CHECK(ids.prompt_tokens_exact);
  const auto batch = inspect_request_body(R"({"prompt": [[1, 2], [3], [4, 5, 6]]})");
  CHECK(batch.prompt_tokens == 6);
  CHECK(batch.prompt_tokens_exact);
  const auto empty = inspect_request_body(R"({"prompt": []})");
  CHECK(empty.prompt_tokens == 0);
  CHECK(empty.prompt_tokens_exact);
}

TEST_CASE("a prompt that is not all token ids is an estimate", "[request-facts]") {
  const auto mixed = inspect_request_body(R"({"prompt": [1, 2, "abcde"]})");
  CHECK(mixed.prompt_tokens == 2 + 2);
  CHECK_FALSE(mixed.prompt_tokens_exact);
  CHECK_FALSE(inspect_request_body(R"({"prompt": [1, 2.5]})").prompt_tokens_exact);
  CHECK_FALSE(inspect_request_body(R"({"prompt": [1, null]})").prompt_tokens_exact);
  CHECK_FALSE(inspect_request_body(R"({"prompt": [[1], {"a": 1}]})").prompt_tokens_exact);
  CHECK_FALSE(inspect_request_body(R"({"prompt": [[1, [2]]]})").prompt_tokens_exact);
  CHECK_FALSE(inspect_request_body(R"({"prompt": [["abcd"]]})").prompt_tokens_exact);
  const auto number = inspect_request_body(R"({"prompt": 12})");
  CHECK(number.prompt_tokens == 0);
  CHECK_FALSE(number.prompt_tokens_exact);
}

TEST_CASE("chat messages: string content and text parts are counted, other parts are not", "[request-facts]") {
  const auto f = inspect_request_body(R"({
    "model": "m",
    "messages": [
      {"role": "system", "content": "abcdefgh"},
      {"role": "user", "content": [
        {"type": "text", "text": "abcd"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAAAAAAAAAAAAAAAAAAAAAAAAAA"}},
        {"text": "abcde", "type": "text"}
      ]},
      {"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{\"text\": \"zzzzzzzz\"}"}}]}
    ],
    "max_completion_tokens": 64})");
  CHECK(f.json_object);
  CHECK(f.model == "m");
  CHECK(f.prompt_tokens == 2 + 1 + 2);
  CHECK_FALSE(f.prompt_tokens_exact);
  CHECK(f.max_tokens == 64u);
}

TEST_CASE("only top-level keys count", "[request-facts]") {
  const auto f = inspect_request_body(R"({
    "messages": [{"role": "user", "content": "abcd", "model": "inner", "n": 9, "max_tokens": 7}],
    "extra": {"model": "deeper", "prompt": "abcdefghijklmnopqrstuvwxyz", "data_parallel_rank": 3},
    "list": [{"model": "in a list"}]})");
  CHECK(f.json_object);
  CHECK(f.model.empty());
  CHECK(f.prompt_tokens == 1);
  CHECK(f.choices == 1);
  CHECK_FALSE(f.max_tokens);
  CHECK_FALSE(f.data_parallel_rank);
}

TEST_CASE("prompt wins over messages when a body has both, in either order", "[request-facts]") {
  CHECK(inspect_request_body(R"({"messages": [{"content": "abcdefghijkl"}], "prompt": "a"})").prompt_tokens == 1);
  CHECK(inspect_request_body(R"({"prompt": "a", "messages": [{"content": "abcdefghijkl"}]})").prompt_tokens == 1);
}

TEST_CASE("a repeated key: the last one wins, even when unusable", "[request-facts]") {
  const auto f = inspect_request_body(R"({"model": "a", "n": 4, "max_tokens": 9, "prompt": [1, 2, 3],
    "model": "b", "n": 2, "max_tokens": 5, "prompt": "abcdefgh", "data_parallel_rank": 1, "data_parallel_rank": 2})");
  CHECK(f.model == "b");
  CHECK(f.choices == 2);
  CHECK(f.max_tokens == 5u);
  CHECK(f.prompt_tokens == 2);
  CHECK_FALSE(f.prompt_tokens_exact);
  CHECK(f.data_parallel_rank == 2);
  const auto cleared = inspect_request_body(R"({"model": "a", "n": 4, "max_tokens": 9, "data_parallel_rank": 1,
    "model": 5, "n": "x", "max_tokens": null, "data_parallel_rank": 1.5})");
  CHECK(cleared.model.empty());
  CHECK(cleared.choices == 1);
  CHECK_FALSE(cleared.max_tokens);
  CHECK_FALSE(cleared.data_parallel_rank);
  // Within a message and a part too.
  CHECK(inspect_request_body(R"({"messages": [{"content": "abcdefghijkl", "content": "a"}]})").prompt_tokens == 1);
  CHECK(inspect_request_body(R"({"messages": [{"content": [{"text": "abcdefgh", "text": "a"}]}]})").prompt_tokens == 1);
}

TEST_CASE("max_completion_tokens is preferred to max_tokens, as vLLM's chat endpoint does", "[request-facts]") {
  CHECK(inspect_request_body(R"({"max_tokens": 10, "max_completion_tokens": 20})").max_tokens == 20u);
  CHECK(inspect_request_body(R"({"max_completion_tokens": 20, "max_tokens": 10})").max_tokens == 20u);
  CHECK(inspect_request_body(R"({"max_completion_tokens": -1, "max_tokens": 10})").max_tokens == 10u);
  CHECK(inspect_request_body(R"({"max_tokens": 0})").max_tokens == 0u);
}

TEST_CASE("wrong types, negatives, fractions and huge numbers", "[request-facts]") {
  CHECK(inspect_request_body(R"({"model": ["m"]})").model.empty());
  CHECK(inspect_request_body(R"({"model": null})").model.empty());
  CHECK_FALSE(inspect_request_body(R"({"max_tokens": -5})").max_tokens);
  CHECK_FALSE(inspect_request_body(R"({"max_tokens": 12.5})").max_tokens);
  CHECK_FALSE(inspect_request_body(R"({"max_tokens": 1e3})").max_tokens);
  CHECK_FALSE(inspect_request_body(R"({"max_tokens": "128"})").max_tokens);
  CHECK(inspect_request_body(R"({"max_tokens": 4294967296})").max_tokens == u32_max);
  CHECK(inspect_request_body(R"({"max_tokens": 18446744073709551615})").max_tokens == u32_max);
  CHECK(inspect_request_body(R"({"max_tokens": 123456789012345678901234567890})").max_tokens == u32_max);
  CHECK_FALSE(inspect_request_body(R"({"max_tokens": -123456789012345678901234567890})").max_tokens);
  CHECK(inspect_request_body(R"({"n": 0})").choices == 1);
  CHECK(inspect_request_body(R"({"n": -3})").choices == 1);
  CHECK(inspect_request_body(R"({"n": 2.0})").choices == 1);
  CHECK(inspect_request_body(R"({"n": 3})").choices == 3);
  CHECK(inspect_request_body(R"({"n": 100000})").choices == dplb::server::max_choices);
  CHECK(inspect_request_body(R"({"data_parallel_rank": 3})").data_parallel_rank == 3);
  CHECK(inspect_request_body(R"({"data_parallel_rank": -1})").data_parallel_rank == -1);
  CHECK(inspect_request_body(R"({"data_parallel_rank": -9223372036854775808})").data_parallel_rank ==
        std::numeric_limits<std::int64_t>::min());
  CHECK_FALSE(inspect_request_body(R"({"data_parallel_rank": 9223372036854775808})").data_parallel_rank);
  CHECK_FALSE(inspect_request_body(R"({"data_parallel_rank": "3"})").data_parallel_rank);
  CHECK_FALSE(inspect_request_body(R"({"data_parallel_rank": null})").data_parallel_rank);
}

TEST_CASE("anything but one valid JSON object gives no facts", "[request-facts]") {
  const request_facts none;
  CHECK(inspect_request_body("") == none);
  CHECK(inspect_request_body("   ") == none);
  CHECK(inspect_request_body("[]") == none);
  CHECK(inspect_request_body(R"(["model", "m"])") == none);
  CHECK(inspect_request_body(R"("model")") == none);
  CHECK(inspect_request_body("42") == none);
  CHECK(inspect_request_body("null") == none);
  CHECK(inspect_request_body(R"({"model": "m", "prompt": "abc)") == none);    // truncated
  CHECK(inspect_request_body(R"({"model": "m", "prompt": [1, 2)") == none);   // truncated
  CHECK(inspect_request_body(R"({"model": "m",})") == none);                  // trailing comma
  CHECK(inspect_request_body(R"({"model": "m"} {"model": "n"})") == none);    // two values
  CHECK(inspect_request_body(R"({'model': 'm'})") == none);
  CHECK(inspect_request_body("{\"model\": \"\xff\"}") == none);              // invalid UTF-8
  CHECK(inspect_request_body(std::string("{\"model\": \"m\"}\0", 15)) == none);
  // Valid, with surrounding whitespace and any spacing inside.
  const auto f = inspect_request_body(" \r\n\t{\"model\"\n:\t\"m\" ,\"n\"  :2}\n");
  CHECK(f.json_object);
  CHECK(f.model == "m");
  CHECK(f.choices == 2);
  CHECK(inspect_request_body("{}").json_object);
}

TEST_CASE("deep nesting neither overflows the stack nor is mistaken for the top level", "[request-facts]") {
  const std::size_t depth = 1'000'000;
  std::string deep = R"({"model": "m", "x": )";
  deep.append(depth, '[');
  deep += R"({"model": "inner"})";
  deep.append(depth, ']');
  deep += R"(, "n": 3})";
  const auto f = inspect_request_body(deep);
  CHECK(f.json_object);
  CHECK(f.model == "m");
  CHECK(f.choices == 3);
  // The same, unterminated.
  CHECK(inspect_request_body(deep.substr(0, deep.size() / 2)) == request_facts{});
}

TEST_CASE("the JSON grammar is enforced: numbers, literals, strings, UTF-8", "[request-facts]") {
  const request_facts none;
  for (const char* number :
       {"01", "1.", ".5", "+1", "-", "1e", "1e+", "-a", "0x1", "1.5.3", "--1", "NaN", "Infinity"}) {
    INFO("number: " << number);
    CHECK(inspect_request_body(std::string(R"({"n": )") + number + "}") == none);
  }
  for (const char* literal : {"tru", "nul", "True", "nulll", "falsey"}) {
    INFO("literal: " << literal);
    CHECK(inspect_request_body(std::string(R"({"stream": )") + literal + "}") == none);
  }
  CHECK(inspect_request_body("{\"prompt\": \"a\tb\"}") == none);            // a raw control character
  CHECK(inspect_request_body(R"({"prompt": "\x41"})") == none);               // not a JSON escape
  CHECK(inspect_request_body(R"({"prompt": "\u12"})") == none);
  CHECK(inspect_request_body(R"({"prompt": "\ud83d"})") == none);            // a lone high surrogate
  CHECK(inspect_request_body(R"({"prompt": "\ude00"})") == none);            // a lone low surrogate
  CHECK(inspect_request_body(R"({"prompt": "\ud83d\u0041"})") == none);
  CHECK(inspect_request_body("{\"prompt\": \"\xc0\xaf\"}") == none);         // overlong
  CHECK(inspect_request_body("{\"prompt\": \"\xed\xa0\x80\"}") == none);     // an encoded surrogate
  CHECK(inspect_request_body("{\"prompt\": \"\xf4\x90\x80\x80\"}") == none); // above U+10FFFF
  CHECK(inspect_request_body("{\"prompt\": \"\xe6\x97\"}") == none);         // cut short
  CHECK(inspect_request_body("{\"model\": \"m\"} \xef\xbb\xbf") == none);
  CHECK(inspect_request_body(R"({"model" "m"})") == none);
  CHECK(inspect_request_body(R"({"model": "m" "n": 1})") == none);
  CHECK(inspect_request_body(R"({"a": [1 2]})") == none);
  CHECK(inspect_request_body(R"({"a": [1,]})") == none);
  CHECK(inspect_request_body(R"({"a": {]})") == none);
  CHECK(inspect_request_body(R"({1: 2})") == none);
  CHECK(inspect_request_body(R"({"a": 1} // comment)") == none);
  // Accepted: a byte order mark first, escapes in keys, \u0000, 4-byte UTF-8, -0, numbers beyond a double.
  CHECK(inspect_request_body(R"({"temperature": 1e400, "top_p": -1e-400, "model": "m"})").model == "m");
  CHECK(inspect_request_body("\xef\xbb\xbf{\"model\": \"m\"}").model == "m");
  CHECK(inspect_request_body(R"({"mod\u0065l": "\u006d\/\n"})").model == "m/\n");
  CHECK(inspect_request_body(R"({"model": "a long run of plain text, \"then\" \\ some escapes\u00e9 and more"})").model ==
        "a long run of plain text, \"then\" \\ some escapes\xc3\xa9 and more");
  CHECK(inspect_request_body(R"({"prompt": "a\u0000b"})").prompt_tokens == 1);
  CHECK(inspect_request_body("{\"prompt\": \"\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"}").prompt_tokens == 2);
  const auto numbers = inspect_request_body(R"({"max_tokens": -0, "n": 2E+1, "x": [-0.5e-3, 0, true, false, null]})");
  CHECK(numbers.max_tokens == 0u);
  CHECK(numbers.choices == 1);
}

// The prefix chain (prefix-aware): only when asked; over what the engine will see first, seeded by the model.
namespace {

std::vector<std::uint64_t> chain_of(std::string_view bytes, std::string_view model, bool separated = false) {
  dplb::balancer::prefix_chain_builder b;
  b.feed(bytes);
  if (separated) b.separate();
  auto chain = b.take();
  dplb::balancer::prefix_chain_builder::reseed(chain, dplb::balancer::prefix_chain_builder::seed_of(model));
  return chain;
}

}  // namespace

TEST_CASE("the prefix chain is built only when asked, over the unescaped prompt, seeded by the model",
          "[request-facts][prefix]") {
  const std::string prompt(600, 'p');
  const std::string body = R"({"prompt": ")" + prompt + R"(", "model": "m1"})";  // the model after the prompt
  CHECK(inspect_request_body(body).prefix_chain.empty());
  const auto f = inspect_request_body(body, true);
  CHECK(f.prefix_chain.size() == 600 / dplb::balancer::prefix_block_bytes);
  REQUIRE_FALSE(f.prefix_chain.empty());
  CHECK(f.prefix_chain == chain_of(prompt, "m1"));
  CHECK(inspect_request_body(R"({"prompt": ")" + prompt + R"(", "model": "m2"})", true).prefix_chain != f.prefix_chain);
  // Escapes are undone first: "\u0070" is "p".
  CHECK(inspect_request_body(R"({"prompt": "\u0070)" + prompt.substr(1) + R"(", "model": "m1"})", true).prefix_chain ==
        f.prefix_chain);
  // The last "prompt" wins, and a prompt wins over messages, wherever they stand.
  const std::string other(600, 'o');
  CHECK(inspect_request_body(R"({"prompt": ")" + other + R"(", "model": "m1", "prompt": ")" + prompt + R"("})", true)
            .prefix_chain == f.prefix_chain);
  CHECK(inspect_request_body(R"({"messages": [{"role": "user", "content": ")" + other + R"("}], "prompt": ")" + prompt +
                                 R"(", "model": "m1"})",
                             true)
            .prefix_chain == f.prefix_chain);
  CHECK(inspect_request_body(R"({"prompt": ")" + prompt + R"(", "messages": [{"role": "user", "content": ")" + other +
                                 R"("}], "model": "m1"})",
                             true)
            .prefix_chain == f.prefix_chain);
}

TEST_CASE("a conversation's chain starts with the chain of every earlier turn", "[request-facts][prefix]") {
  const std::string system(400, 's');
  const std::string first(200, 'a');
  const std::string answer(180, 'b');
  const std::string second(240, 'c');
  const auto turn1 = inspect_request_body(R"({"model": "m", "messages": [{"role": "system", "content": ")" + system +
                                              R"("}, {"role": "user", "content": ")" + first + R"("}]})",
                                          true);
  const auto turn2 = inspect_request_body(
      R"({"model": "m", "messages": [{"role": "system", "content": ")" + system + R"("}, {"role": "user", "content": [{"type": "text", "text": ")" +
          first + R"("}]}, {"role": "assistant", "content": ")" + answer + R"("}, {"role": "user", "content": ")" + second +
          R"("}]})",
      true);
  REQUIRE(turn1.prefix_chain.size() == (400 + 1 + 200 + 1) / dplb::balancer::prefix_block_bytes);
  REQUIRE(turn1.prefix_chain.size() >= 1);
  REQUIRE(turn2.prefix_chain.size() > turn1.prefix_chain.size());
  CHECK(std::equal(turn1.prefix_chain.begin(), turn1.prefix_chain.end(), turn2.prefix_chain.begin()));
}

TEST_CASE("token ids feed the chain 4 bytes each: a block is 64 ids", "[request-facts][prefix]") {
  std::string ids;
  for (int i = 0; i < 160; ++i) ids += (i ? "," : "") + std::to_string(1000 + i);
  const auto f = inspect_request_body(R"({"model": "m", "prompt": [)" + ids + "]}", true);
  CHECK(f.prefix_chain.size() == 2);  // 160 ids: 2 full blocks of 64
  const auto g = inspect_request_body(R"({"model": "m", "prompt": [)" + ids + ",7,8,9]}", true);
  CHECK(std::equal(f.prefix_chain.begin(), f.prefix_chain.end(), g.prefix_chain.begin()));
}

TEST_CASE("token ids for the KV-cache events: a prompt of ids, a batch's first, and cache_salt", "[request-facts][kv]") {
  // Only when asked (prefix-aware), as the prefix chain.
  CHECK(inspect_request_body(R"({"prompt":[1,2,3]})").prompt_token_ids.empty());
  const auto flat = inspect_request_body(R"({"model":"m","prompt":[1,2,4294967295],"cache_salt":"s1"})", true);
  CHECK(flat.prompt_token_ids == std::vector<std::uint32_t>{1, 2, 4294967295u});
  CHECK(flat.cache_salt == "s1");
  const auto batch = inspect_request_body(R"({"prompt":[[5,6],[7,8,9]]})", true);
  CHECK(batch.prompt_token_ids == std::vector<std::uint32_t>{5, 6});
  CHECK(batch.prompt_tokens == 5);  // the cost still counts the whole batch
  // The last "prompt" wins; text, an id beyond 32 bits or a negative one leave no ids to match.
  CHECK(inspect_request_body(R"({"prompt":[1,2],"prompt":[3]})", true).prompt_token_ids == std::vector<std::uint32_t>{3});
  CHECK(inspect_request_body(R"({"prompt":[1,2],"prompt":"text"})", true).prompt_token_ids.empty());
  CHECK(inspect_request_body(R"({"prompt":[1,4294967296]})", true).prompt_token_ids.empty());
  CHECK(inspect_request_body(R"({"prompt":[1,-2]})", true).prompt_token_ids.empty());
  CHECK(inspect_request_body(R"({"prompt":[1,"two"]})", true).prompt_token_ids.empty());
  CHECK(inspect_request_body(R"({"messages":[{"role":"user","content":"hi"}]})", true).prompt_token_ids.empty());
  CHECK(inspect_request_body(R"({"prompt":[1],"cache_salt":7})", true).cache_salt.empty());
  CHECK(inspect_request_body(R"({"prompt":[1],"cache_salt":"a","cache_salt":null})", true).cache_salt.empty());
}

TEST_CASE("token ids: ids and arrays of ids mixed at the top of a prompt give none", "[request-facts][kv]") {
  CHECK(inspect_request_body(R"({"prompt":[[1,2],3]})", true).prompt_token_ids.empty());
  CHECK(inspect_request_body(R"({"prompt":[3,[1,2]]})", true).prompt_token_ids.empty());
  CHECK(inspect_request_body(R"({"prompt":[[],[1,2]]})", true).prompt_token_ids.empty());  // the first is empty
  CHECK(inspect_request_body(R"({"prompt":[-0,1]})", true).prompt_token_ids == std::vector<std::uint32_t>{0, 1});
}

TEST_CASE("priority: vLLM's integer field at the top level, negative values kept, the last one wins", "[request-facts]") {
  CHECK_FALSE(inspect_request_body(R"({"prompt": "a"})").priority);
  CHECK(inspect_request_body(R"({"prompt": "a", "priority": 5})").priority == 5);
  CHECK(inspect_request_body(R"({"priority": -3, "prompt": "a"})").priority == -3);
  CHECK(inspect_request_body(R"({"priority": 1, "priority": 2})").priority == 2);
  // Not an integer, or not at the top level: no priority (the engine decides what it makes of it).
  CHECK_FALSE(inspect_request_body(R"({"priority": 1, "priority": "high"})").priority);
  CHECK_FALSE(inspect_request_body(R"({"priority": 1.5})").priority);
  CHECK_FALSE(inspect_request_body(R"({"messages": [{"content": "x", "priority": 4}]})").priority);
  // Whether the key is there at all, whatever its value.
  CHECK_FALSE(inspect_request_body(R"({"prompt": "a"})").has_priority_key);
  CHECK(inspect_request_body(R"({"priority": "high"})").has_priority_key);
  CHECK(inspect_request_body(R"({"priorit\u0079": -4})").has_priority_key);
  CHECK(inspect_request_body(R"({"priorit\u0079": -4})").priority == -4);
  CHECK_FALSE(inspect_request_body(R"({"messages": [{"content": "x", "priority": 4}]})").has_priority_key);
}

namespace {

// What the engine gets for `body` at `priority`: the body itself when unchanged, "unusable" when refused.
std::string engine_body(const std::string& body, std::int64_t priority) {
  using dplb::server::priority_body;
  const auto out = dplb::server::body_with_priority(body, inspect_request_body(body), priority);
  if (out.result == priority_body::outcome::unusable) return "unusable";
  return out.result == priority_body::outcome::rewritten ? out.body : body;
}

}  // namespace

TEST_CASE("min_priority: the engine's body carries the priority dplb serves the request with", "[request-facts][tenants]") {
  // Already so, or none at 0 (vLLM's default): the client's bytes.
  CHECK(engine_body(R"({"prompt": "a", "priority": 5})", 5) == R"({"prompt": "a", "priority": 5})");
  CHECK(engine_body(R"({"prompt": "a"})", 0) == R"({"prompt": "a"})");
  // None, raised above 0: added before the closing brace, every other byte the client's.
  CHECK(engine_body(R"({"prompt": "a",  "max_tokens": 3 } )", 2) == R"({"prompt": "a",  "max_tokens": 3 ,"priority":2} )");
  CHECK(engine_body(R"( { } )", 7) == R"( { "priority":7} )");
  CHECK(engine_body(R"({"messages": [{"role": "user", "content": "x", "priority": 1}]})", 3) ==
        R"({"messages": [{"role": "user", "content": "x", "priority": 1}],"priority":3})");
  // Below the floor: set, in place, the members' order kept.
  CHECK(engine_body(R"({"model": "m", "priority": -100, "prompt": "a"})", 0) == R"({"model":"m","priority":0,"prompt":"a"})");
  // Repeated (the last one is what vLLM reads), escaped, or not an integer (pydantic would coerce "-100"):
  // one member, at the floor.
  CHECK(engine_body(R"({"priority": 9, "prompt": "a", "priority": -100})", 1) == R"({"priority":1,"prompt":"a"})");
  CHECK(engine_body(R"({"priorit\u0079": -100, "prompt": "a"})", 1) == R"({"priority":1,"prompt":"a"})");
  CHECK(engine_body(R"({"priority": "-100"})", 0) == R"({"priority":0})");
  CHECK(engine_body(R"({"priority": -1.0})", 0) == R"({"priority":0})");
  // Not a JSON object: nothing to set (the engine refuses it); too deep, or a number nlohmann cannot read back
  // while a priority of the client's is there: refused rather than forwarded with it.
  CHECK(engine_body("not json", 3) == "not json");
  CHECK(engine_body(R"({"priority": -1, "x": 1e400})", 0) == "unusable");
  const std::string deep = R"({"priority": -1, "x": )" + std::string(200, '[') + std::string(200, ']') + "}";
  CHECK(engine_body(deep, 0) == "unusable");
}
