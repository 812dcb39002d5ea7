#include <catch2/catch.hpp>

#include "dplb/upstream/engine_stats_poller.hpp"

using dplb::upstream::parse_engine_load;

TEST_CASE("engine load is read from vLLM's gauges, summed over their series", "[engine-stats]") {
  const auto load = parse_engine_load(
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"M\"} 3.0\n"
      "vllm:num_requests_running{engine=\"1\",model_name=\"M\"} 2.0\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"M\"} 7.0\n"
      "vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 100.0\n"  // a longer name: not ours
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"M\"} 0.5\n");
  REQUIRE(load);
  CHECK(load->running == 5);
  CHECK(load->waiting == 7);
}

TEST_CASE("engine load parsing copes with odd label values, no labels and CRLF-free edge cases", "[engine-stats]") {
  const auto load = parse_engine_load(
      "vllm:num_requests_waiting{model_name=\"a} b\\\" c\"} 2\n"
      "vllm:num_requests_running 4e0");  // no labels, no final newline, exponent form
  REQUIRE(load);
  CHECK(load->waiting == 2);
  CHECK(load->running == 4);
}

TEST_CASE("a page without the gauges, or with unusable values, gives no load", "[engine-stats]") {
  CHECK_FALSE(parse_engine_load(""));
  CHECK_FALSE(parse_engine_load("vllm:prompt_tokens_total{engine=\"0\"} 12\n"));
  CHECK_FALSE(parse_engine_load("vllm:num_requests_waiting{engine=\"0\"} NaN\n"));
  CHECK_FALSE(parse_engine_load("vllm:num_requests_waiting{engine=\"0\"} -1\n"));
  CHECK_FALSE(parse_engine_load("vllm:num_requests_waiting{engine=\"0\" 3\n"));  // unterminated labels
  CHECK_FALSE(parse_engine_load("# vllm:num_requests_waiting 3\n"));
}
