#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include "dplb/upstream/engine_metrics_parser.hpp"

using dplb::upstream::engine_sample;
using dplb::upstream::parse_engine_samples;

namespace {

engine_sample sample_of(std::uint32_t engine, double running, double waiting, std::optional<double> kv,
                        bool has_counts = true) {
  return engine_sample{engine, running, waiting, kv, has_counts};
}

}  // namespace

// The line reader under parse_engine_samples: names, labels, values and line ends.

TEST_CASE("engine samples: vLLM's gauges are taken by their exact names", "[engine-samples]") {
  const auto samples = parse_engine_samples(
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"M\"} 3.0\n"
      "vllm:num_requests_running{engine=\"1\",model_name=\"M\"} 2.0\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"M\"} 7.0\n"
      "vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 100.0\n"  // a longer name: not ours
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"M\"} 0.5\n");
  REQUIRE(samples.size() == 2);
  CHECK(samples[0] == sample_of(0, 3, 7, 0.5));
  CHECK(samples[1] == sample_of(1, 2, 0, std::nullopt));
}

TEST_CASE("engine samples: odd label values, no labels and no final newline are read", "[engine-samples]") {
  const auto samples = parse_engine_samples(
      "vllm:num_requests_waiting{model_name=\"a} b\\\" c\"} 2\n"
      "vllm:num_requests_running 4e0");  // no labels, no final newline, exponent form
  REQUIRE(samples.size() == 1);
  CHECK(samples[0] == sample_of(0, 4, 2, std::nullopt));
}

TEST_CASE("engine samples: a page without the gauges, or with unusable values, gives none", "[engine-samples]") {
  CHECK(parse_engine_samples("").empty());
  CHECK(parse_engine_samples("vllm:prompt_tokens_total{engine=\"0\"} 12\n").empty());
  CHECK(parse_engine_samples("vllm:num_requests_waiting{engine=\"0\"} NaN\n").empty());
  CHECK(parse_engine_samples("vllm:num_requests_waiting{engine=\"0\"} -1\n").empty());
  CHECK(parse_engine_samples("vllm:num_requests_waiting{engine=\"0\" 3\n").empty());  // unterminated labels
  CHECK(parse_engine_samples("# vllm:num_requests_waiting 3\n").empty());
}

TEST_CASE("engine samples: CRLF line ends, timestamps, tabs and a leading '+' are read, a value with a tail is not",
          "[engine-samples]") {
  const auto samples = parse_engine_samples(
      "vllm:num_requests_waiting{engine=\"0\"} 2.0 1700000000000\r\n"
      "vllm:num_requests_running\t+3\r\n"
      "vllm:num_requests_running{engine=\"1\"} 5abc\r\n");
  REQUIRE(samples.size() == 1);
  CHECK(samples[0] == sample_of(0, 3, 2, std::nullopt));
}

// What it gathers: per engine, sums and maxima.


TEST_CASE("engine samples: one page with internal DP gives one entry per engine, sorted", "[engine-samples]") {
  const auto samples = parse_engine_samples(
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"1\",model_name=\"M\"} 2.0\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"M\"} 3.0\n"
      "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
      "# TYPE vllm:num_requests_waiting gauge\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"M\"} 1.0\n"
      "vllm:num_requests_waiting{engine=\"1\",model_name=\"M\"} 0.0\n"
      "\n"
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"M\"} 0.0421\n"
      "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"M\"} 0.5\n"
      "vllm:prompt_tokens_total{engine=\"0\",model_name=\"M\"} 12345.0\n");
  REQUIRE(samples.size() == 2);
  CHECK(samples[0] == sample_of(0, 3, 1, 0.0421));
  CHECK(samples[1] == sample_of(1, 2, 0, 0.5));
}

TEST_CASE("engine samples: an external-LB server shows its own rank, and no engine label is engine 0", "[engine-samples]") {
  const auto rank3 = parse_engine_samples("vllm:num_requests_running{model_name=\"M\",engine=\"3\"} 4\n");
  REQUIRE(rank3.size() == 1);
  CHECK(rank3[0] == sample_of(3, 4, 0, std::nullopt));
  const auto unlabelled = parse_engine_samples("vllm:num_requests_waiting 6\nvllm:kv_cache_usage_perc{} 0.25\n");
  REQUIRE(unlabelled.size() == 1);
  CHECK(unlabelled[0] == sample_of(0, 0, 6, 0.25));
}

TEST_CASE("engine samples: several series of one engine are summed, KV usage is their max", "[engine-samples]") {
  const auto samples = parse_engine_samples(
      "vllm:num_requests_running{engine=\"2\",model_name=\"a\"} 1\n"
      "vllm:num_requests_running{engine=\"2\",model_name=\"b\"} 2\n"
      "vllm:num_requests_waiting{engine=\"2\",model_name=\"a\"} 3\n"
      "vllm:num_requests_waiting{engine=\"2\",model_name=\"b\"} 4\n"
      "vllm:kv_cache_usage_perc{engine=\"2\",model_name=\"a\"} 0.7\n"
      "vllm:kv_cache_usage_perc{engine=\"2\",model_name=\"b\"} 0.2\n");
  REQUIRE(samples.size() == 1);
  CHECK(samples[0] == sample_of(2, 3, 7, 0.7));
}

TEST_CASE("engine samples: the old KV cache name counts only for an engine without the new one", "[engine-samples]") {
  const auto samples = parse_engine_samples(
      "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.9\n"
      "vllm:kv_cache_usage_perc{engine=\"0\"} 0.1\n"
      "vllm:gpu_cache_usage_perc{engine=\"1\"} 0.3\n");
  REQUIRE(samples.size() == 2);
  CHECK(samples[0] == sample_of(0, 0, 0, 0.1, false));
  CHECK(samples[1] == sample_of(1, 0, 0, 0.3, false));
}

TEST_CASE("engine samples: engine labels that are not decimal integers in [0, 4095] are ignored", "[engine-samples]") {
  for (const char* label : {"-1", "4096", "99999999999", "1.0", "0x1", "+1", " 1", "1 ", "", "a", "1\\\""}) {
    INFO("engine label: " << label);
    const std::string page = std::string("vllm:num_requests_running{engine=\"") + label + "\"} 1\n";
    CHECK(parse_engine_samples(page).empty());
  }
  const auto samples = parse_engine_samples(
      "vllm:num_requests_running{engine=\"4095\"} 1\n"
      "vllm:num_requests_running{engine=\"007\"} 2\n");
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].engine == 7);
  CHECK(samples[1].engine == 4095);
  // A label set that cannot be read, or has the engine label twice, is ignored too.
  CHECK(parse_engine_samples("vllm:num_requests_running{engine=\"1\",engine=\"2\"} 1\n").empty());
  CHECK(parse_engine_samples("vllm:num_requests_running{engine=1} 1\n").empty());
  CHECK(parse_engine_samples("vllm:num_requests_running{engine=\"1\" model=\"m\"} 1\n").empty());
  CHECK(parse_engine_samples("vllm:num_requests_running{engine=\"1\"\n").empty());
}

TEST_CASE("engine samples: unusable values are ignored, KV usage is clamped to 1", "[engine-samples]") {
  for (const char* value : {"NaN", "+Inf", "-Inf", "-1", "-0.5", "abc", "", "1e999", "0x10", "3,0", "2.0garbage"}) {
    INFO("value: " << value);
    CHECK(parse_engine_samples(std::string("vllm:num_requests_waiting{engine=\"0\"} ") + value + "\n").empty());
  }
  const auto samples = parse_engine_samples(
      "vllm:kv_cache_usage_perc{engine=\"0\"} 1.5\n"
      "vllm:kv_cache_usage_perc{engine=\"1\"} NaN\n"
      "vllm:num_requests_running{engine=\"1\"} 1e3\n");
  REQUIRE(samples.size() == 2);
  CHECK(samples[0] == sample_of(0, 0, 0, 1.0, false));
  CHECK(samples[1] == sample_of(1, 1000, 0, std::nullopt));
}

TEST_CASE("engine samples: CRLF, timestamps, label order, escapes, unknown labels, blanks", "[engine-samples]") {
  const auto samples = parse_engine_samples(
      "# TYPE vllm:num_requests_running gauge\r\n"
      "\r\n"
      "vllm:num_requests_running{model_name=\"a \\\"q\\\" \\\\ } {\",engine=\"1\",other=\"x\"} 2 1700000000000\r\n"
      "  vllm:num_requests_waiting{ engine = \"1\" , model_name=\"b\", } \t 5\r\n"
      "vllm:kv_cache_usage_perc{engine=\"1\"} 2.5e-1");  // no final newline
  REQUIRE(samples.size() == 1);
  CHECK(samples[0] == sample_of(1, 2, 5, 0.25));
}

TEST_CASE("engine samples: other metrics sharing a name prefix are not ours", "[engine-samples]") {
  CHECK(parse_engine_samples(
            "vllm:num_requests_running_total{engine=\"0\"} 9\n"
            "vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 9\n"
            "vllm:kv_cache_usage_perc_max{engine=\"0\"} 0.9\n"
            "vllm:num_requests_runnin{engine=\"0\"} 9\n"
            "# vllm:num_requests_running{engine=\"0\"} 9\n"
            "vllm:num_requests_running{engine=\"0\"}\n"
            "vllm:num_requests_running{engine=\"0\"}9\n")
            .empty());
  CHECK(parse_engine_samples("").empty());
}
