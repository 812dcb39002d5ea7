#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <string_view>

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

namespace {

// A stream of `tokens` events as vLLM writes them (one per step), without usage, then [DONE].
std::string stream_of(int tokens, std::string_view newline = "\n") {
  std::string out;
  for (int i = 0; i < tokens; ++i) {
    out += "data: {\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" tok\\n"
           "data: x\",\"finish_reason\":null}]}";
    out += newline;
    out += newline;
  }
  out += "data: [DONE]";
  out += newline;
  out += newline;
  return out;
}

std::uint64_t events_in(std::string_view bytes, std::size_t piece) {
  usage_scanner s;
  s.count_stream_events();
  for (std::size_t at = 0; at < bytes.size(); at += piece) s.feed(bytes.substr(at, piece));
  return s.stream_events();
}

}  // namespace

TEST_CASE("stream events: each data event but [DONE] counts, whatever the split points", "[usage][tenants]") {
  const auto stream = stream_of(37);
  for (std::size_t piece : {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{64}, stream.size()}) {
    INFO("pieces of " << piece << " bytes");
    CHECK(events_in(stream, piece) == 37);
  }
  // CRLF line ends, "data:" without its space, and an empty data line (nothing in it).
  CHECK(events_in(stream_of(5, "\r\n"), 3) == 5);
  CHECK(events_in("data:{\"a\":1}\n\ndata:\n\ndata: [DONE]\n\n", 1) == 1);
  // Other SSE fields and comments are no tokens; a JSON body is no stream.
  CHECK(events_in(": keep-alive\n\nevent: x\nid: 3\n\n", 4) == 0);
  CHECK(events_in(R"({"choices":[{"text":"data: no"}],"usage":{"completion_tokens":3}})", 7) == 0);
}

TEST_CASE("stream events: not counted unless asked, and the usage is found as before", "[usage][tenants]") {
  usage_scanner plain;
  plain.feed(sse_stream);
  CHECK(plain.stream_events() == 0);
  usage_scanner counting;
  counting.count_stream_events();
  counting.feed(sse_stream);
  CHECK(counting.stream_events() == 2);  // the token's event and the usage's
  CHECK(counting.prompt_tokens() == 1024u);
  CHECK(counting.completion_tokens() == 128u);
}
