#include <catch2/catch.hpp>

#include <string>

#include "dplb/metrics/usage_scanner.hpp"

using dplb::metrics::usage_scanner;

namespace {

const std::string sse_stream =
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"M\",\"choices\":[{\"index\":0,"
    "\"text\":\" the\",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}\n\n"
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"M\",\"choices\":[],"
    "\"usage\":{\"prompt_tokens\":1024,\"total_tokens\":1152,\"completion_tokens\":128}}\n\n"
    "data: [DONE]\n\n";

}  // namespace

TEST_CASE("usage is found in an SSE stream fed whole", "[usage]") {
  usage_scanner s;
  s.feed(sse_stream);
  CHECK(s.prompt_tokens() == 1024u);
  CHECK(s.completion_tokens() == 128u);
}

TEST_CASE("usage is found whatever the split points of the stream", "[usage]") {
  // Every possible two-way split, and a feed of one byte at a time.
  for (std::size_t cut = 0; cut <= sse_stream.size(); ++cut) {
    usage_scanner s;
    s.feed(std::string_view(sse_stream).substr(0, cut));
    s.feed(std::string_view(sse_stream).substr(cut));
    INFO("cut at " << cut);
    REQUIRE(s.prompt_tokens() == 1024u);
    REQUIRE(s.completion_tokens() == 128u);
  }
  usage_scanner bytewise;
  for (char c : sse_stream) bytewise.feed(std::string_view(&c, 1));
  CHECK(bytewise.prompt_tokens() == 1024u);
  CHECK(bytewise.completion_tokens() == 128u);
}

TEST_CASE("usage in a pretty-printed non-streaming JSON response", "[usage]") {
  usage_scanner s;
  s.feed("{\n  \"id\": \"chatcmpl-1\",\n  \"usage\": {\n    \"prompt_tokens\" : 7,\n"
         "    \"total_tokens\": 19,\n    \"completion_tokens\":\t12\n  }\n}");
  CHECK(s.prompt_tokens() == 7u);
  CHECK(s.completion_tokens() == 12u);
}

TEST_CASE("generated text that mentions the keys is not mistaken for usage", "[usage]") {
  usage_scanner s;
  s.feed(R"(data: {"choices":[{"text":"say \"prompt_tokens\": 99 and \"completion_tokens\":5"}]})"
         "\n\n");
  CHECK_FALSE(s.prompt_tokens());
  CHECK_FALSE(s.completion_tokens());
  s.feed(R"({"x":"prompt_tokens","prompt_tokens_details":{"cached_tokens":3}})");
  CHECK_FALSE(s.prompt_tokens());
}

TEST_CASE("with usage on every chunk the last value wins", "[usage]") {
  usage_scanner s;
  for (int i = 1; i <= 5; ++i) {
    s.feed("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"total_tokens\":" + std::to_string(10 + i) +
           ",\"completion_tokens\":" + std::to_string(i) + "}}\n\n");
  }
  CHECK(s.prompt_tokens() == 10u);
  CHECK(s.completion_tokens() == 5u);
}

TEST_CASE("a response without usage reports none, and null usage is ignored", "[usage]") {
  usage_scanner s;
  s.feed(R"(data: {"choices":[{"delta":{"content":"hi"}}],"usage":null})");
  CHECK_FALSE(s.prompt_tokens());
  CHECK_FALSE(s.completion_tokens());
}

TEST_CASE("absurdly long numbers saturate instead of overflowing", "[usage]") {
  usage_scanner s;
  s.feed("{\"prompt_tokens\":" + std::string(60, '9') + ",\"completion_tokens\":1}");
  REQUIRE(s.prompt_tokens());
  CHECK(*s.prompt_tokens() > 1'000'000'000'000'000u);
  CHECK(s.completion_tokens() == 1u);
}

TEST_CASE("a key right after an empty string or another quote is still found", "[usage]") {
  // The fast path skips quotes that cannot open a key; a quote right after one may.
  for (const std::string text : {R"({"a":"","prompt_tokens":5,"completion_tokens":6})",
                                 R"({"a":"x""prompt_tokens":5,"""completion_tokens":6})"}) {
    INFO(text);
    for (std::size_t cut = 0; cut <= text.size(); ++cut) {
      usage_scanner s;
      s.feed(std::string_view(text).substr(0, cut));
      s.feed(std::string_view(text).substr(cut));
      REQUIRE(s.prompt_tokens() == 5u);
      REQUIRE(s.completion_tokens() == 6u);
    }
  }
}

TEST_CASE("the closing quote of a key read is never the opening quote of the next", "[usage]") {
  // Found by fuzz_usage_scanner when the fast path moved from quotes to underscores: after
  // `"prompt_tokens"`, the quote it ends with does not open `completion_tokens"`; after another name
  // (`"total_tokens"`) it may, as the state machine would have it.
  const std::string text = R"("completion_tokens":4,"prompt_tokens"completion_tokens":5,"total_tokens"prompt_tokens":7,)";
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    INFO(cut);
    usage_scanner s;
    s.feed(std::string_view(text).substr(0, cut));
    s.feed(std::string_view(text).substr(cut));
    REQUIRE(s.completion_tokens() == 4u);
    REQUIRE(s.prompt_tokens() == 7u);
  }
}
