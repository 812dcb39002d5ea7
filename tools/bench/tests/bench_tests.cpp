// The load generator's pure parts: SSE assembly, event inspection, the per-response recorder, the
// workload, the summary and the command line. No sockets.

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <sstream>

#include "bench_cli.hpp"
#include "loadgen.hpp"
#include "recorder.hpp"
#include "sse.hpp"
#include "workload.hpp"

using namespace dplb::loadgen;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> feed_in_pieces(std::string_view bytes, std::size_t piece) {
  sse_reader reader;
  std::vector<std::string> events;
  for (std::size_t at = 0; at < bytes.size(); at += piece) {
    reader.feed(bytes.substr(at, piece), [&](std::string_view data) { events.emplace_back(data); });
  }
  return events;
}

const std::string token_event =
    R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}]})";
const std::string usage_event =
    R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1024,"total_tokens":1152,"completion_tokens":128}})";

}  // namespace

TEST_CASE("sse_reader yields the same events however the bytes are split") {
  const std::string stream = "data: " + token_event + "\n\n" + "data: " + usage_event + "\n\n" + "data: [DONE]\n\n";
  for (std::size_t piece = 1; piece <= stream.size(); ++piece) {
    const auto events = feed_in_pieces(stream, piece);
    REQUIRE(events.size() == 3);
    CHECK(events[0] == token_event);
    CHECK(events[1] == usage_event);
    CHECK(events[2] == "[DONE]");
  }
}

TEST_CASE("sse_reader handles CRLF, comments, other fields and multi-line data") {
  const auto events = feed_in_pieces(": ping\r\nevent: x\r\ndata: a\r\ndata:b\r\nid: 7\r\n\r\n\n\ndata: c\n\n", 3);
  REQUIRE(events.size() == 2);
  CHECK(events[0] == "a\nb");
  CHECK(events[1] == "c");
}

TEST_CASE("sse_reader never delivers an unterminated event") {
  sse_reader reader;
  int delivered = 0;
  reader.feed("data: [DONE]\n", [&](std::string_view) { ++delivered; });
  CHECK(delivered == 0);
  CHECK(reader.mid_event());
  reader.feed("\n", [&](std::string_view) { ++delivered; });
  CHECK(delivered == 1);
  CHECK_FALSE(reader.mid_event());
}

TEST_CASE("sse_reader drops a line over its limit and says so") {
  sse_reader reader(16);
  int delivered = 0;
  reader.feed("data: 0123456789", [&](std::string_view) { ++delivered; });
  reader.feed("abcdef", [&](std::string_view) { ++delivered; });
  CHECK(reader.overflowed());
}

TEST_CASE("inspect_event tells tokens, usage, errors and the end apart") {
  auto info = inspect_event(token_event);
  CHECK(info.content);
  CHECK_FALSE(info.usage);
  CHECK_FALSE(info.error);

  info = inspect_event(usage_event);
  CHECK_FALSE(info.content);
  REQUIRE(info.usage);
  CHECK(info.usage->prompt_tokens == 1024);
  CHECK(info.usage->completion_tokens == 128);

  info = inspect_event(R"({"choices":[{"index":0,"text":"x"}],"usage":null})");
  CHECK(info.content);
  CHECK_FALSE(info.usage);

  info = inspect_event(R"({"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})");
  CHECK(info.content);

  CHECK(inspect_event("[DONE]").done);
  CHECK(inspect_event(R"({"error":{"message":"boom","type":"BadRequestError","code":400}})").error);
  CHECK(inspect_event(R"({"object":"error","message":"boom","code":400})").error);
}

TEST_CASE("find_usage stays inside the usage object") {
  const auto usage = find_usage(
      R"({"prompt_tokens":1,"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}})");
  REQUIRE(usage);
  CHECK(usage->prompt_tokens == 7);
  CHECK(usage->completion_tokens == 2);
  CHECK_FALSE(find_usage(R"({"usage":{"total_tokens":9}})"));
  CHECK_FALSE(find_usage(R"({"usage":null})"));
}

namespace {

using rclock = std::chrono::steady_clock;

request_result started_result(rclock::time_point t0, unsigned status = 200) {
  request_result r;
  r.start = t0;
  r.status = status;
  r.max_tokens = 3;
  return r;
}

}  // namespace

TEST_CASE("response_recorder measures TTFT and gaps per read, usage from the usage event") {
  const auto t0 = rclock::now();
  auto r = started_result(t0);
  response_recorder recorder(r, response_recorder::body_kind::event_stream);
  const std::string token = "data: " + token_event + "\n\n";
  recorder.consume(token.substr(0, 10), t0 + 5ms);  // half an event: no token yet
  recorder.consume(token.substr(10), t0 + 10ms);
  recorder.consume(token + token, t0 + 30ms);  // two in one read: the second gap is 0
  recorder.consume("data: " + usage_event + "\n\ndata: [DONE]\n\n", t0 + 31ms);
  recorder.complete(t0 + 32ms);
  CHECK(r.ok);
  CHECK(r.error.empty());
  CHECK(r.events == 3);
  CHECK(r.ttft_s == Approx(0.010));
  REQUIRE(r.itl_s.size() == 2);
  CHECK(r.itl_s[0] == Approx(0.020));
  CHECK(r.itl_s[1] == Approx(0.0).margin(1e-12));
  CHECK(r.has_usage);
  CHECK(r.prompt_tokens == 1024);
  CHECK(r.completion_tokens == 128);
  CHECK(r.e2e_s == Approx(0.032));
}

TEST_CASE("response_recorder fails a stream without [DONE], and in-band errors") {
  const auto t0 = rclock::now();
  {
    auto r = started_result(t0);
    response_recorder recorder(r, response_recorder::body_kind::event_stream);
    recorder.consume("data: " + token_event + "\n\n", t0 + 1ms);
    recorder.complete(t0 + 2ms);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "stream ended without data: [DONE]");
  }
  {
    auto r = started_result(t0);
    response_recorder recorder(r, response_recorder::body_kind::event_stream);
    recorder.consume("data: " + token_event + "\n\n", t0 + 1ms);
    recorder.fail(t0 + 2ms, "reading the body: end of stream");
    CHECK_FALSE(r.ok);
    CHECK(r.error == "reading the body: end of stream mid-stream");
  }
  {
    auto r = started_result(t0);
    response_recorder recorder(r, response_recorder::body_kind::event_stream);
    recorder.consume(R"(data: {"error":{"message":"rank 9 out of range","code":400}})"
                     "\n\ndata: [DONE]\n\n",
                     t0 + 1ms);
    recorder.complete(t0 + 2ms);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "in-band error: rank 9 out of range");
  }
}

TEST_CASE("response_recorder reads a JSON body and an error body") {
  const auto t0 = rclock::now();
  {
    auto r = started_result(t0);
    response_recorder recorder(r, response_recorder::body_kind::json);
    recorder.consume(R"({"choices":[{"text":"a b"}],"usage":{"prompt_tokens":5,)", t0 + 1ms);
    recorder.consume(R"("total_tokens":7,"completion_tokens":2}})", t0 + 2ms);
    recorder.complete(t0 + 3ms);
    CHECK(r.ok);
    CHECK(r.prompt_tokens == 5);
    CHECK(r.completion_tokens == 2);
    CHECK(r.ttft_s == Approx(0.003));
  }
  {
    auto r = started_result(t0, 404);
    response_recorder recorder(r, response_recorder::body_kind::error_text);
    recorder.consume("{\"error\":\n\"no\"}", t0 + 1ms);
    recorder.complete(t0 + 2ms);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "HTTP 404: {\"error\": \"no\"}");
  }
}

TEST_CASE("plan_requests draws lengths in range, the same for the same seed") {
  request_shape shape;
  shape.input_len = 100;
  shape.output_len = 10;
  shape.range_ratio = 0.5;
  const auto plans = plan_requests(shape, 500, 42);
  bool varied = false;
  for (const auto& plan : plans) {
    CHECK(plan.input_words >= 50);
    CHECK(plan.input_words <= 150);
    CHECK(plan.max_tokens >= 5);
    CHECK(plan.max_tokens <= 15);
    varied = varied || plan.input_words != plans.front().input_words;
  }
  CHECK(varied);
  const auto again = plan_requests(shape, 500, 42);
  CHECK(again[77].input_words == plans[77].input_words);
  CHECK(again[77].prompt_seed == plans[77].prompt_seed);

  shape.range_ratio = 0;
  for (const auto& plan : plan_requests(shape, 10, 1)) {
    CHECK(plan.input_words == 100);
    CHECK(plan.max_tokens == 10);
  }
}

TEST_CASE("plan_requests draws a long class with its share, leaving the others as without it") {
  request_shape shape;
  shape.input_len = 200;
  shape.output_len = 100;
  const auto plain = plan_requests(shape, 2000, 9);
  shape.long_share = 0.1;
  shape.long_input_len = 8000;
  const auto mixed = plan_requests(shape, 2000, 9);
  std::size_t longs = 0;
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    CHECK(mixed[i].max_tokens == 100);  // no long output length: the normal one
    CHECK(mixed[i].prompt_seed == plain[i].prompt_seed);
    if (mixed[i].input_words == 8000) {
      ++longs;
    } else {
      CHECK(mixed[i].input_words == 200);
    }
  }
  CHECK(longs > 150);
  CHECK(longs < 250);
  CHECK(plan_requests(shape, 2000, 9)[1234].input_words == mixed[1234].input_words);  // the same for a seed

  shape.long_share = 1;
  shape.long_output_len = 7;
  shape.range_ratio = 0.5;
  for (const auto& plan : plan_requests(shape, 50, 3)) {
    CHECK(plan.input_words >= 4000);
    CHECK(plan.input_words <= 12000);
    CHECK(plan.max_tokens >= 3);
    CHECK(plan.max_tokens <= 11);
  }
  shape.long_share = 0;  // the long lengths alone change nothing
  shape.range_ratio = 0;
  for (const auto& plan : plan_requests(shape, 50, 3)) CHECK(plan.input_words == 200);
}

TEST_CASE("request bodies are JSON with exactly input_words prompt words") {
  request_shape shape;
  request_plan plan{37, 9, 1234};
  auto json = nlohmann::json::parse(request_body(shape, "m\"x", plan));
  CHECK(json["model"] == "m\"x");
  CHECK(json["max_tokens"] == 9);
  CHECK(json["stream"] == true);
  CHECK(json["stream_options"]["include_usage"] == true);
  CHECK(json["ignore_eos"] == true);
  std::istringstream words(json["prompt"].get<std::string>());
  std::size_t count = 0;
  for (std::string w; words >> w;) ++count;
  CHECK(count == 37);

  shape.endpoint = "/v1/chat/completions";
  shape.stream = false;
  shape.ignore_eos = false;
  json = nlohmann::json::parse(request_body(shape, "m", plan));
  CHECK(json["messages"][0]["role"] == "user");
  CHECK(json["max_completion_tokens"] == 9);
  CHECK(json["stream"] == false);
  CHECK_FALSE(json.contains("stream_options"));
  CHECK_FALSE(json.contains("ignore_eos"));
}

TEST_CASE("arrival_offsets: all at once for inf, mean gap 1/rate otherwise") {
  for (double t : arrival_offsets(50, std::numeric_limits<double>::infinity(), 1.0, 0)) CHECK(t == 0.0);
  const auto offsets = arrival_offsets(20001, 100.0, 1.0, 3);
  CHECK(offsets.front() == 0.0);
  CHECK(offsets.back() / 20000 == Approx(0.01).epsilon(0.05));
  for (std::size_t i = 1; i < offsets.size(); ++i) REQUIRE(offsets[i] >= offsets[i - 1]);
  const auto bursty = arrival_offsets(20001, 100.0, 0.25, 3);
  CHECK(bursty.back() / 20000 == Approx(0.01).epsilon(0.1));
}

TEST_CASE("arrival_offsets: a spread burst starts request k of N at k * spread / N") {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const auto offsets = arrival_offsets(256, inf, 1.0, 7, 0.4);
  REQUIRE(offsets.size() == 256);
  for (std::size_t k = 0; k < offsets.size(); ++k) REQUIRE(offsets[k] == Approx(0.4 * double(k) / 256).margin(1e-12));
  CHECK(offsets.front() == 0.0);
  CHECK(offsets.back() < 0.4);  // the window is [0, spread): the last one is one gap before its end
  // Evenly paced, whatever the seed: the schedule is deterministic.
  CHECK(arrival_offsets(256, inf, 1.0, 8, 0.4) == offsets);
  CHECK(arrival_offsets(1, inf, 1.0, 0, 0.4) == std::vector<double>{0.0});
  CHECK(arrival_offsets(0, inf, 1.0, 0, 0.4).empty());
}

TEST_CASE("validate rejects what run() cannot send") {
  run_options options;
  CHECK(validate(options).empty());
  options.shape.range_ratio = 1.0;
  CHECK_FALSE(validate(options).empty());
  options.shape.range_ratio = 0;
  options.shape.extra_headers = {{"x-a", "b\r\nx-evil: 1"}};
  CHECK_FALSE(validate(options).empty());
  options.shape.extra_headers.clear();
  options.request_rate = 0;
  CHECK_FALSE(validate(options).empty());
  options.request_rate = std::numeric_limits<double>::infinity();
  options.burst_spread = std::chrono::milliseconds(400);
  CHECK(validate(options).empty());
  options.burst_spread = std::chrono::duration<double>(-0.001);
  CHECK_FALSE(validate(options).empty());
  options.burst_spread = std::chrono::milliseconds(400);
  options.request_rate = 10;  // a finite rate paces requests itself
  CHECK(validate(options).find("infinite request rate") != std::string::npos);
  options.burst_spread = {};
  options.shape.long_share = 1.5;
  CHECK(validate(options).find("long share") != std::string::npos);
  options.shape.long_share = 0.5;
  CHECK(validate(options).empty());
}

namespace {

request_result finished_ok(rclock::time_point start, double ttft, double e2e, int rank, std::uint64_t out) {
  request_result r;
  r.ok = true;
  r.status = 200;
  r.rank = rank;
  r.start = start;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.events = out;
  for (std::uint64_t i = 1; i < out; ++i) r.itl_s.push_back((e2e - ttft) / static_cast<double>(out - 1));
  r.has_usage = true;
  r.prompt_tokens = 10;
  r.completion_tokens = out;
  return r;
}

}  // namespace

TEST_CASE("summarize computes vllm's figures and the per-rank spread") {
  const auto t0 = rclock::now();
  run_report report;
  report.duration_s = 2.0;
  report.results.push_back(finished_ok(t0, 0.1, 1.0, 0, 11));
  report.results.push_back(finished_ok(t0 + 500ms, 0.3, 1.0, 0, 11));
  report.results.push_back(finished_ok(t0 + 1200ms, 0.2, 0.5, 2, 11));
  request_result failed;
  failed.status = 503;
  failed.rank = 2;
  failed.error = "HTTP 503";
  report.results.push_back(failed);
  request_result refused;
  refused.error = "connecting: Connection refused";
  report.results.push_back(refused);

  const auto s = summarize(report);
  CHECK(s.completed == 3);
  CHECK(s.failed == 2);
  CHECK(s.total_input_tokens == 30);
  CHECK(s.total_output_tokens == 33);
  CHECK(s.request_throughput == Approx(1.5));
  CHECK(s.output_throughput == Approx(16.5));
  CHECK(s.ttft.mean_ms == Approx(200));
  CHECK(s.ttft.median_ms == Approx(200));
  CHECK(s.ttft.p99_ms == Approx(298));  // numpy: 200 + 0.98 * 100
  CHECK(s.tpot.mean_ms == Approx((90.0 + 70.0 + 30.0) / 3));
  CHECK(s.itl.samples == 30);
  CHECK(s.peak_concurrency == 2);
  // rank 1 got nothing and shows as 0; the 503 counts for rank 2; the refused one nowhere.
  CHECK(s.per_rank == std::map<int, std::size_t>{{0, 2}, {1, 0}, {2, 2}});
  CHECK(s.rank_spread == 2);
  CHECK(s.errors.at("HTTP 503") == 1);

  const auto text = format_summary(s);
  CHECK(text.find("============ Serving Benchmark Result ============\n") == 0);
  CHECK(text.find("Successful requests:                     3\n") != std::string::npos);
  CHECK(text.find("Mean TTFT (ms):                          200.00\n") != std::string::npos);
  CHECK(text.find("rank 1:                                  0 (0.0%)\n") != std::string::npos);
  CHECK(text.find("max-min:                                 2\n") != std::string::npos);

  const auto json = to_json(s, report);
  CHECK(json["completed"] == 3);
  CHECK(json["per_rank"]["2"] == 2);
  CHECK(json["rank_max_min"] == 2);
  // Per request, in order: the TTFT (null when failed) and the prompt words sent, to split TTFT by class.
  REQUIRE(json["ttfts"].size() == 5);
  CHECK(json["ttfts"][1].get<double>() == Approx(0.3));
  CHECK(json["ttfts"][3].is_null());
  CHECK(json["input_lens"].size() == 5);
}

TEST_CASE("an even burst has a spread of 0") {
  const auto t0 = rclock::now();
  run_report report;
  report.duration_s = 1;
  for (int i = 0; i < 256; ++i) report.results.push_back(finished_ok(t0, 0.01, 0.1, i % 4, 4));
  const auto s = summarize(report);
  CHECK(s.per_rank == std::map<int, std::size_t>{{0, 64}, {1, 64}, {2, 64}, {3, 64}});
  CHECK(s.rank_spread == 0);
  CHECK(s.peak_concurrency == 256);
}

namespace {

dplb::bench::cli_result parse(std::vector<const char*> args, std::string* error = nullptr) {
  args.insert(args.begin(), "dplb-bench");
  std::ostringstream out, err;
  auto result = dplb::bench::parse_command_line(static_cast<int>(args.size()), args.data(), out, err);
  if (error) *error = err.str();
  return result;
}

}  // namespace

TEST_CASE("the command line has vllm bench serve's defaults and shapes") {
  auto parsed = parse({});
  REQUIRE(parsed.options);
  const auto& run = parsed.options->run;
  CHECK(run.host == "127.0.0.1");
  CHECK(run.port == 8000);
  CHECK(run.shape.endpoint == "/v1/completions");
  CHECK(std::isinf(run.request_rate));
  CHECK(run.num_prompts == 1000);
  CHECK(run.shape.input_len == 1024);
  CHECK(run.shape.output_len == 128);
  CHECK(run.shape.stream);
  CHECK_FALSE(run.shape.ignore_eos);
  CHECK(run.burst_spread.count() == 0);

  parsed = parse({"--num-prompts", "256", "--burst-spread-ms", "400"});
  REQUIRE(parsed.options);
  CHECK(parsed.options->run.burst_spread.count() == Approx(0.4));
  CHECK(std::isinf(parsed.options->run.request_rate));
  CHECK(parsed.options->run.shape.long_share == 0);

  parsed = parse({"--long-share", "0.1", "--long-input-len", "8000", "--long-output-len", "64"});
  REQUIRE(parsed.options);
  CHECK(parsed.options->run.shape.long_share == Approx(0.1));
  CHECK(parsed.options->run.shape.long_input_len == 8000);
  CHECK(parsed.options->run.shape.long_output_len == 64);

  parsed = parse({"--backend", "openai-chat", "--base-url", "http://[::1]:9000/api/", "--request-rate", "12.5",
                  "--max-concurrency", "64", "--ignore-eos", "--no-stream", "--header", "Authorization=Bearer k",
                  "--timeout-s", "1.5"});
  REQUIRE(parsed.options);
  const auto& chat = parsed.options->run;
  CHECK(chat.host == "::1");
  CHECK(chat.port == 9000);
  CHECK(chat.shape.endpoint == "/api/v1/chat/completions");
  CHECK(chat.request_rate == 12.5);
  CHECK(chat.max_concurrency == 64);
  CHECK(chat.shape.ignore_eos);
  CHECK_FALSE(chat.shape.stream);
  CHECK(chat.timeout == std::chrono::milliseconds(1500));
  REQUIRE(chat.shape.extra_headers.size() == 1);
  CHECK(chat.shape.extra_headers[0] == std::pair<std::string, std::string>{"Authorization", "Bearer k"});
}

TEST_CASE("a bad command line is one line and exit status 2") {
  for (const auto& args : std::vector<std::vector<const char*>>{{"--request-rate", "0"},
                                                                {"--request-rate", "fast"},
                                                                {"--backend", "tgi"},
                                                                {"--base-url", "https://x"},
                                                                {"--max-concurrency", "0"},
                                                                {"--random-range-ratio", "1"},
                                                                {"--num-prompts", "-3"},
                                                                {"--burst-spread-ms=-1"},
                                                                {"--long-share", "1.01"},
                                                                {"--burst-spread-ms", "400", "--request-rate", "10"},
                                                                {"--bogus"}}) {
    std::string error;
    const auto parsed = parse(args, &error);
    CHECK_FALSE(parsed.options);
    CHECK(parsed.exit_code == 2);
    CHECK(error.rfind("dplb-bench: ", 0) == 0);
    CHECK(std::count(error.begin(), error.end(), '\n') == 1);
  }
  CHECK(parse({"--help"}).exit_code == 0);
}

TEST_CASE("parse_base_url") {
  auto url = dplb::bench::parse_base_url("http://localhost");
  REQUIRE(url);
  CHECK(url->host == "localhost");
  CHECK(url->port == 80);
  CHECK(url->path_prefix.empty());
  CHECK_FALSE(dplb::bench::parse_base_url("http://:80"));
  CHECK_FALSE(dplb::bench::parse_base_url("http://h:99999"));
  CHECK_FALSE(dplb::bench::parse_base_url("127.0.0.1:8000"));
}

// Shared prefixes and multi-turn sessions (issue 10's workloads).

namespace {

std::vector<std::string> words_of(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

std::vector<std::string> head_words(const std::vector<std::string>& words, std::size_t n) {
  return {words.begin(), words.begin() + static_cast<std::ptrdiff_t>(std::min(n, words.size()))};
}

}  // namespace

TEST_CASE("plan_requests draws prefix groups uniformly, leaving everything else as without them") {
  request_shape shape;
  shape.input_len = 100;
  const auto plain = plan_requests(shape, 1600, 5);
  shape.prefix_groups = 16;
  shape.prefix_len = 1500;
  const auto grouped = plan_requests(shape, 1600, 5);
  std::vector<std::size_t> per_group(16, 0);
  std::vector<std::uint64_t> seed_of(16, 0);
  for (std::size_t i = 0; i < grouped.size(); ++i) {
    const auto& plan = grouped[i];
    REQUIRE(plan.prefix_group >= 0);
    REQUIRE(plan.prefix_group < 16);
    CHECK(plan.prefix_words == 1500);
    CHECK(plan.prompt_words() == 1600);
    CHECK(plan.input_words == plain[i].input_words);
    CHECK(plan.prompt_seed == plain[i].prompt_seed);  // the own words stay unique per request
    const auto g = static_cast<std::size_t>(plan.prefix_group);
    if (per_group[g]++ == 0) seed_of[g] = plan.prefix_seed;
    CHECK(plan.prefix_seed == seed_of[g]);  // one prefix per group
  }
  for (const std::size_t n : per_group) {
    CHECK(n > 60);  // 100 expected
    CHECK(n < 140);
  }
  CHECK(std::set<std::uint64_t>(seed_of.begin(), seed_of.end()).size() == 16);
  // The group's prefix depends on the seed and the group only, not on how many requests there are.
  const auto fewer = plan_requests(shape, 10, 5);
  for (const auto& plan : fewer) {
    CHECK(plan.prefix_seed == group_prefix_seed(5, static_cast<std::size_t>(plan.prefix_group)));
  }
  CHECK(group_prefix_seed(5, 3) != group_prefix_seed(6, 3));
  CHECK(plain.front().prefix_group == -1);
  CHECK(plain.front().prefix_words == 0);
}

TEST_CASE("a grouped request's prompt is its group's prefix, then its own words") {
  request_shape shape;
  shape.input_len = 20;
  shape.prefix_groups = 2;
  shape.prefix_len = 50;
  const auto plans = plan_requests(shape, 64, 11);
  const auto prompt_of = [&](const request_plan& plan) {
    return words_of(nlohmann::json::parse(request_body(shape, "m", plan))["prompt"].get<std::string>());
  };
  const request_plan* same[2] = {nullptr, nullptr};
  for (const auto& plan : plans) {
    if (plan.prefix_group != plans[0].prefix_group) continue;
    if (same[0] == nullptr) {
      same[0] = &plan;
    } else if (same[1] == nullptr) {
      same[1] = &plan;
    }
  }
  const auto other = std::find_if(plans.begin(), plans.end(),
                                  [&](const request_plan& p) { return p.prefix_group != plans[0].prefix_group; });
  REQUIRE(same[1] != nullptr);
  REQUIRE(other != plans.end());
  const auto a = prompt_of(*same[0]), b = prompt_of(*same[1]), c = prompt_of(*other);
  REQUIRE(a.size() == 70);
  REQUIRE(b.size() == 70);
  CHECK(head_words(a, 50) == head_words(b, 50));
  CHECK(std::vector<std::string>(a.begin() + 50, a.end()) != std::vector<std::string>(b.begin() + 50, b.end()));
  CHECK(head_words(a, 50) != head_words(c, 50));

  shape.endpoint = "/v1/chat/completions";
  const auto chat = nlohmann::json::parse(request_body(shape, "m", *same[0]));
  CHECK(words_of(chat["messages"][0]["content"].get<std::string>()) == a);
}

TEST_CASE("a conversation sends its whole history, the prefix in the first user message only") {
  request_shape shape;
  shape.endpoint = "/v1/chat/completions";
  shape.input_len = 10;
  shape.prefix_groups = 1;
  shape.prefix_len = 30;
  const auto plans = plan_requests(shape, 2, 3);
  conversation talk;
  talk.add_user_turn(plans[0]);
  CHECK(talk.words() == 40);
  auto first = nlohmann::json::parse(talk.request_body(shape, "m", 7));
  REQUIRE(first["messages"].size() == 1);
  CHECK(first["max_completion_tokens"] == 7);
  const std::string opening = first["messages"][0]["content"];
  CHECK(words_of(opening).size() == 40);

  talk.add_answer(" tok \"quoted\"\n tok");  // as received; the body must escape it
  talk.add_user_turn(plans[1]);
  CHECK(talk.words() == 40 + 3 + 10);
  const auto second = nlohmann::json::parse(talk.request_body(shape, "m", 7));
  REQUIRE(second["messages"].size() == 3);
  CHECK(second["messages"][0]["role"] == "user");
  CHECK(second["messages"][0]["content"] == opening);  // the same bytes: the cached blocks match
  CHECK(second["messages"][1]["role"] == "assistant");
  CHECK(second["messages"][1]["content"] == " tok \"quoted\"\n tok");
  CHECK(second["messages"][2]["role"] == "user");
  CHECK(words_of(second["messages"][2]["content"].get<std::string>()).size() == 10);
  CHECK(second["stream"] == true);
}

TEST_CASE("append_answer_text takes completions text, chat deltas and a chat message") {
  std::string text;
  append_answer_text(token_event, text);
  CHECK(text == " the");
  append_answer_text(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", text);
  append_answer_text(R"({"choices":[{"index":0,"delta":{"content":" tok"}}]})", text);
  append_answer_text(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})", text);
  append_answer_text(usage_event, text);
  append_answer_text("[DONE]", text);
  CHECK(text == " the tok");
  text.clear();
  append_answer_text(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"a b"}}],"usage":{}})", text);
  CHECK(text == "a b");
  CHECK(count_words(" tok tok\ttok\n") == 3);
  CHECK(count_words("") == 0);
  CHECK(count_words("   ") == 0);
}

TEST_CASE("response_recorder keeps the answer text only when asked") {
  const auto t0 = rclock::now();
  const std::string chat_token = R"(data: {"choices":[{"index":0,"delta":{"content":" tok"}}]})" "\n\n";
  for (const bool keep : {false, true}) {
    auto r = started_result(t0);
    response_recorder recorder(r, response_recorder::body_kind::event_stream, keep);
    recorder.consume(chat_token + chat_token + "data: [DONE]\n\n", t0 + 1ms);
    recorder.complete(t0 + 2ms);
    CHECK(r.ok);
    CHECK(r.answer == (keep ? " tok tok" : ""));
  }
}

TEST_CASE("validate checks prefix groups and sessions") {
  run_options options;
  options.shape.prefix_groups = 4;
  CHECK(validate(options).find("prefix length") != std::string::npos);
  options.shape.prefix_len = 100;
  CHECK(validate(options).empty());
  options.chat_sessions.sessions = 10;
  options.chat_sessions.turns = 3;
  CHECK(validate(options).find("chat endpoint") != std::string::npos);
  options.shape.endpoint = "/v1/chat/completions";
  CHECK(validate(options).find("sessions * turns") != std::string::npos);
  options.num_prompts = 30;
  CHECK(validate(options).empty());
  options.chat_sessions.header = "x-session id";
  CHECK(validate(options).find("session header") != std::string::npos);
  options.chat_sessions.header = "x-session-id";
  options.chat_sessions.turns = 0;
  CHECK_FALSE(validate(options).empty());
}

TEST_CASE("the command line takes prefix groups and sessions, and the number of prompts follows the sessions") {
  auto parsed = parse({"--prefix-groups", "16", "--prefix-len", "1500", "--random-input-len", "100"});
  REQUIRE(parsed.options);
  CHECK(parsed.options->run.shape.prefix_groups == 16);
  CHECK(parsed.options->run.shape.prefix_len == 1500);
  CHECK_FALSE(parsed.options->run.chat_sessions.enabled());

  parsed = parse({"--backend", "openai-chat", "--sessions", "8", "--turns", "4", "--session-header", "x-session-id"});
  REQUIRE(parsed.options);
  CHECK(parsed.options->run.num_prompts == 32);
  CHECK(parsed.options->run.chat_sessions.sessions == 8);
  CHECK(parsed.options->run.chat_sessions.turns == 4);
  CHECK(parsed.options->run.chat_sessions.header == "x-session-id");
  CHECK(parse({"--backend", "openai-chat", "--sessions", "8", "--turns", "4", "--num-prompts", "32"}).options);

  for (const auto& args : std::vector<std::vector<const char*>>{
           {"--backend", "openai-chat", "--sessions", "8", "--turns", "4", "--num-prompts", "31"},
           {"--sessions", "8", "--turns", "4"},  // completions have no history
           {"--prefix-groups", "4"}}) {
    std::string error;
    const auto bad = parse(args, &error);
    CHECK_FALSE(bad.options);
    CHECK(bad.exit_code == 2);
    CHECK(std::count(error.begin(), error.end(), '\n') == 1);
  }
}
