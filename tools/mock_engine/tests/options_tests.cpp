// The mock's command line for simulated serving: defaults, the flags that need --simulate, refusals.

#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>
#include <utility>

#include "mock_options.hpp"

using namespace dplb::mock;
using namespace std::chrono_literals;

namespace {

struct parsed_line {
  command_line_result result;
  std::string out;
  std::string err;
};

parsed_line parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dplb-mock-engine");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out;
  std::ostringstream err;
  auto result = parse_command_line(static_cast<int>(argv.size()), argv.data(), out, err);
  return {std::move(result), out.str(), err.str()};
}

}  // namespace

TEST_CASE("options: without --simulate the mock is as before", "[options]") {
  const auto p = parse({});
  REQUIRE(p.result.options);
  CHECK_FALSE(p.result.options->simulate);
  CHECK_FALSE(p.result.options->dp_lockstep);
}

TEST_CASE("options: --dp sets the DP engines per port, one by default", "[options]") {
  auto p = parse({});
  REQUIRE(p.result.options);
  CHECK(p.result.options->dp == 1);
  p = parse({"--ranks", "2", "--dp", "4"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->ranks == 2);
  CHECK(p.result.options->dp == 4);
  for (const char* bad : {"0", "-1", "1025"}) {
    INFO(bad);
    CHECK_FALSE(parse({"--dp", bad}).result.options);
  }
  CHECK_FALSE(parse({"--ranks", "8", "--dp", "1000"}).result.options);  // more than 4096 engines
  p = parse({"--simulate", "--kv-blocks", "1000", "--block-size", "32", "--no-enable-prefix-caching"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->engine.kv.num_blocks == 1000);
  CHECK(p.result.options->engine.kv.block_size == 32);
  CHECK_FALSE(p.result.options->engine.kv.prefix_caching);
  for (const char* needs_simulate : {"--kv-blocks", "--block-size"}) {
    INFO(needs_simulate);
    CHECK_FALSE(parse({needs_simulate, "16"}).result.options);
  }
  CHECK_FALSE(parse({"--no-enable-prefix-caching"}).result.options);
  CHECK_FALSE(parse({"--simulate", "--kv-blocks", "0"}).result.options);
  CHECK_FALSE(parse({"--simulate", "--block-size", "0"}).result.options);
  CHECK_FALSE(parse({"--simulate", "--block-size", "1025"}).result.options);
}

TEST_CASE("options: --simulate defaults", "[options]") {
  const auto p = parse({"--simulate"});
  REQUIRE(p.result.options);
  const auto& o = *p.result.options;
  CHECK(o.simulate);
  CHECK_FALSE(o.dp_lockstep);
  CHECK(o.time_scale == 1.0);
  CHECK(o.start_after == 0);
  CHECK(o.engine.kv.num_blocks == 65536);  // 1 Mi tokens: never full in the default benchmarks
  CHECK(o.engine.kv.block_size == 16);
  CHECK(o.engine.kv.prefix_caching);
  CHECK(o.engine.max_num_seqs == 256);
  CHECK(o.engine.max_num_batched_tokens == 8192);
  CHECK(o.engine.step_base == 15ms);
  CHECK(o.engine.step_per_token == 150us);
  CHECK(o.engine.prefill_per_token == 20us);
  CHECK(o.engine.capture_sizes == dplb::mock::sim::default_capture_sizes(256));
}

TEST_CASE("options: --simulate with every flag", "[options]") {
  const auto p = parse({"--simulate", "--dp-lockstep", "--time-scale", "10", "--start-after", "256", "--max-num-seqs", "64",
                        "--max-num-batched-tokens", "0", "--step-base-us", "1000.5", "--step-us-per-token",
                        "0", "--prefill-us-per-token", "0.25", "--cudagraph-sizes", "8,1,4,2,8"});
  REQUIRE(p.result.options);
  const auto& o = *p.result.options;
  CHECK(o.dp_lockstep);
  CHECK(o.time_scale == 10.0);
  CHECK(o.start_after == 256);
  CHECK(o.engine.max_num_seqs == 64);
  CHECK(o.engine.max_num_batched_tokens == 0);
  CHECK(o.engine.step_base == 1'000'500ns);
  CHECK(o.engine.step_per_token == 0ns);
  CHECK(o.engine.prefill_per_token == 250ns);
  CHECK(o.engine.capture_sizes == std::vector<std::uint32_t>{1, 2, 4, 8});
}

TEST_CASE("options: --max-num-seqs sets the default capture sizes", "[options]") {
  const auto p = parse({"--simulate", "--max-num-seqs", "32"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->engine.capture_sizes.back() == 64);
}

TEST_CASE("options: simulation flags are refused without --simulate, and bad values always", "[options]") {
  const std::vector<std::vector<std::string>> refused = {
      {"--dp-lockstep"},
      {"--time-scale", "10"},
      {"--start-after", "10"},
      {"--simulate", "--start-after", "-1"},
      {"--max-num-seqs", "8"},
      {"--cudagraph-sizes", "1,2"},
      {"--step-base-us", "1"},
      {"--simulate", "--itl-ms", "5"},
      {"--simulate", "--ttft-ms", "5"},
      {"--simulate", "--time-scale", "0"},
      {"--simulate", "--time-scale", "-1"},
      {"--simulate", "--time-scale", "nan"},
      {"--simulate", "--max-num-seqs", "0"},
      {"--simulate", "--max-num-batched-tokens", "100"},  // below max_num_seqs 256
      {"--simulate", "--step-base-us", "-1"},
      {"--simulate", "--step-base-us", "0", "--step-us-per-token", "0"},
      {"--simulate", "--cudagraph-sizes", ""},
      {"--simulate", "--cudagraph-sizes", "1,,2"},
      {"--simulate", "--cudagraph-sizes", "0,8"},
      {"--simulate", "--cudagraph-sizes", "8x"},
  };
  for (const auto& args : refused) {
    INFO(args.back());
    const auto p = parse(args);
    CHECK_FALSE(p.result.options);
    CHECK(p.result.exit_code == 2);
    CHECK(p.err.rfind("dplb-mock-engine: ", 0) == 0);
  }
}

TEST_CASE("options: --help shows every simulation flag with its default", "[options]") {
  const auto p = parse({"--help"});
  CHECK_FALSE(p.result.options);
  CHECK(p.result.exit_code == 0);
  for (const char* text : {"--simulate", "--dp-lockstep", "--time-scale X (=1)", "--start-after N (=0)", "--max-num-seqs N (=256)",
                           "--max-num-batched-tokens N (=8192)", "--step-base-us US (=15000)",
                           "--step-us-per-token US (=150)", "--prefill-us-per-token US (=20)",
                           "--cudagraph-sizes", "mock_padded_tokens_total", "mock_step_lag_seconds_total",
                           "--dp N (=1)", "--kv-blocks N (=65536)", "--block-size N (=16)", "--no-enable-prefix-caching", "vllm:prefix_cache_hits_total", "X-data-parallel-rank",
                           "/metrics/override", "/metrics/raw", "GET    /stats", "x-mock-engine"}) {
    INFO(text);
    CHECK(p.out.find(text) != std::string::npos);
  }
}

TEST_CASE("options: --dp-balance is least-inflight by default, oracle with its --load-bound", "[options]") {
  auto p = parse({});
  REQUIRE(p.result.options);
  CHECK(p.result.options->balance == dp_balance::least_inflight);
  CHECK(p.result.options->load_bound == 1.25);
  p = parse({"--dp", "2", "--dp-balance", "least-inflight"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->balance == dp_balance::least_inflight);
  p = parse({"--simulate", "--dp", "4", "--dp-balance", "oracle"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->balance == dp_balance::oracle);
  CHECK(p.result.options->load_bound == 1.25);
  p = parse({"--simulate", "--dp", "4", "--dp-balance", "oracle", "--load-bound", "1"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->load_bound == 1.0);
  p = parse({"--simulate", "--dp", "4", "--dp-balance", "oracle", "--load-bound", "2.5", "--threads", "1"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->load_bound == 2.5);
}

TEST_CASE("options: the oracle's flags are refused where they cannot apply", "[options]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--dp-balance", "random"}, "--dp-balance must be least-inflight or oracle"},
      {{"--dp-balance", ""}, "--dp-balance must be"},
      {{"--dp", "4", "--dp-balance", "oracle"}, "needs --simulate"},
      {{"--simulate", "--dp-balance", "oracle"}, "needs --dp > 1"},
      {{"--simulate", "--dp", "1", "--dp-balance", "oracle"}, "needs --dp > 1"},
      {{"--simulate", "--dp", "4", "--dp-balance", "oracle", "--threads", "2"}, "needs --threads 1"},
      {{"--simulate", "--dp", "4", "--dp-balance", "oracle", "--no-enable-prefix-caching"}, "needs prefix caching"},
      {{"--simulate", "--dp", "4", "--load-bound", "2"}, "--load-bound needs --dp-balance oracle"},
      {{"--simulate", "--dp", "4", "--dp-balance", "least-inflight", "--load-bound", "2"}, "needs --dp-balance oracle"},
      {{"--simulate", "--dp", "4", "--dp-balance", "oracle", "--load-bound", "0.99"}, "[1, 1000000]"},
      {{"--simulate", "--dp", "4", "--dp-balance", "oracle", "--load-bound", "-1"}, "[1, 1000000]"},
      {{"--simulate", "--dp", "4", "--dp-balance", "oracle", "--load-bound", "nan"}, "[1, 1000000]"},
      {{"--simulate", "--dp", "4", "--dp-balance", "oracle", "--load-bound", "inf"}, "[1, 1000000]"},
      {{"--simulate", "--dp", "4", "--dp-balance", "oracle", "--load-bound", "x"}, ""},
  };
  for (const auto& [args, message] : refused) {
    INFO(args.back());
    const auto p = parse(args);
    CHECK_FALSE(p.result.options);
    CHECK(p.result.exit_code == 2);
    CHECK(p.err.rfind("dplb-mock-engine: ", 0) == 0);
    CHECK(p.err.find(message) != std::string::npos);
  }
}

TEST_CASE("options: --help shows the balancing modes", "[options]") {
  const auto p = parse({"--help"});
  for (const char* text : {"--dp-balance MODE (=least-inflight)", "--load-bound C (=1.25)", "oracle",
                           "ceil(C * (T + 1) / N)"}) {
    INFO(text);
    CHECK(p.out.find(text) != std::string::npos);
  }
}

TEST_CASE("options: --kv-role is both by default, prefill or decode with their own flags", "[options]") {
  auto p = parse({});
  REQUIRE(p.result.options);
  CHECK(p.result.options->role == kv_role::both);
  CHECK(p.result.options->kv_hold_timeout == 480s);
  CHECK(p.result.options->kv_transfer_per_block == 20us);

  p = parse({"--kv-role", "prefill", "--kv-hold-timeout-ms", "250"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->role == kv_role::prefill);
  CHECK(p.result.options->kv_hold_timeout == 250ms);

  p = parse({"--kv-role", "decode", "--kv-transfer-us-per-block", "1.5"});
  REQUIRE(p.result.options);
  CHECK(p.result.options->role == kv_role::decode);
  CHECK(p.result.options->kv_transfer_per_block == 1500ns);

  // Both roles simulate: a prefill pays its prompt's prefill, a decode skips it.
  for (const char* role : {"prefill", "decode"}) {
    INFO(role);
    p = parse({"--kv-role", role, "--simulate", "--dp-lockstep", "--ranks", "4"});
    REQUIRE(p.result.options);
    CHECK(p.result.options->simulate);
    CHECK(p.result.options->role == (std::string_view(role) == "prefill" ? kv_role::prefill : kv_role::decode));
  }

  const std::vector<std::vector<std::string>> refused = {
      {"--kv-role", "router"},
      {"--kv-hold-timeout-ms", "10"},  // needs prefill
      {"--kv-role", "decode", "--kv-hold-timeout-ms", "10"},
      {"--kv-role", "prefill", "--kv-hold-timeout-ms", "0"},
      {"--kv-transfer-us-per-block", "10"},  // needs decode
      {"--kv-role", "decode", "--kv-transfer-us-per-block", "-1"},
  };
  for (const auto& args : refused) {
    INFO(args.back());
    const auto r = parse(args);
    CHECK_FALSE(r.result.options);
    CHECK(r.result.exit_code == 2);
  }
  const auto help = parse({"--help"});
  for (const char* text : {"--kv-role ROLE (=both)", "--kv-hold-timeout-ms MS (=480000)",
                           "--kv-transfer-us-per-block US (=20)", "/internal/kv-pull"}) {
    INFO(text);
    CHECK(help.out.find(text) != std::string::npos);
  }
}
