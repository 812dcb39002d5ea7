// dplb-bench: `vllm bench serve`'s random-dataset benchmark, plus how requests spread over DP ranks.

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>

#include "bench_cli.hpp"
#include "loadgen.hpp"

namespace {

// A one-line bar on stderr, redrawn in place; only used when stderr is a terminal.
void draw_progress(std::size_t done, std::size_t total) {
  constexpr std::size_t width = 40;
  const std::size_t filled = total == 0 ? width : done * width / total;
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r[%s] %zu/%zu", bar.c_str(), done, total);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

std::string now_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &local);
  return text;
}

void print_preamble(const dplb::bench::cli_options& cli) {
  const auto& run = cli.run;
  std::cout << "Benchmark: " << run.num_prompts << " prompts to http://" << run.host << ':' << run.port
            << run.shape.endpoint << (run.shape.stream ? " (streaming)" : " (not streaming)") << '\n';
  if (std::isinf(run.request_rate)) {
    std::cout << "Traffic request rate: inf\n";
    if (run.burst_spread.count() > 0) std::cout << "Burst spread: " << run.burst_spread.count() * 1000 << " ms\n";
  } else {
    std::cout << "Traffic request rate: " << run.request_rate << '\n';
  }
  char burstiness[32];
  std::snprintf(burstiness, sizeof burstiness, run.burstiness == std::floor(run.burstiness) ? "%.1f" : "%g",
                run.burstiness);
  std::cout << "Burstiness factor: " << burstiness
            << (run.burstiness == 1.0 ? " (Poisson process)" : " (Gamma distribution)") << '\n';
  std::cout << "Maximum request concurrency: ";
  if (run.max_concurrency == 0) {
    std::cout << "None\n";
  } else {
    std::cout << run.max_concurrency << '\n';
  }
  std::cout << std::flush;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = dplb::bench::parse_command_line(argc, argv, std::cout, std::cerr);
  if (!parsed.options) return parsed.exit_code;
  auto& cli = *parsed.options;

  const std::uint64_t open_files = dplb::loadgen::raise_open_file_limit();
  const std::size_t connections = cli.run.max_concurrency != 0 ? cli.run.max_concurrency : cli.run.num_prompts;
  if (open_files != 0 && connections + 64 > open_files) {
    std::cerr << "dplb-bench: warning: up to " << connections << " connections but only " << open_files
              << " open files allowed (ulimit -n); some requests may fail\n";
  }
  if (!cli.quiet) print_preamble(cli);
  if (!cli.quiet && ::isatty(STDERR_FILENO) == 1) cli.run.progress = draw_progress;

  const auto report = dplb::loadgen::run(cli.run);
  if (!report.error.empty()) {
    std::cerr << "dplb-bench: " << report.error << '\n';
    return 1;
  }
  const auto summary = dplb::loadgen::summarize(report);
  std::cout << dplb::loadgen::format_summary(summary) << std::flush;

  if (!cli.result_json.empty()) {
    auto json = dplb::loadgen::to_json(summary, report);
    json["date"] = now_stamp();
    json["backend"] = cli.backend;
    json["base_url"] = cli.base_url;
    json["endpoint"] = cli.run.shape.endpoint;
    json["request_rate"] = std::isinf(cli.run.request_rate) ? nlohmann::json("inf") : nlohmann::json(cli.run.request_rate);
    json["burstiness"] = cli.run.burstiness;
    json["burst_spread_ms"] = cli.run.burst_spread.count() * 1000;
    json["max_concurrency"] = cli.run.max_concurrency == 0 ? nlohmann::json(nullptr) : nlohmann::json(cli.run.max_concurrency);
    json["random_input_len"] = cli.run.shape.input_len;
    json["random_output_len"] = cli.run.shape.output_len;
    json["random_range_ratio"] = cli.run.shape.range_ratio;
    json["long_share"] = cli.run.shape.long_share;
    json["long_input_len"] = cli.run.shape.long_input_len;
    json["long_output_len"] = cli.run.shape.long_output_len;
    json["prefix_groups"] = cli.run.shape.prefix_groups;
    json["prefix_len"] = cli.run.shape.prefix_len;
    json["sessions"] = cli.run.chat_sessions.sessions;
    json["turns"] = cli.run.chat_sessions.turns;
    json["session_header"] = cli.run.chat_sessions.header;
    json["seed"] = cli.run.seed;
    std::ofstream file(cli.result_json);
    file << json.dump(2) << '\n';
    if (!file) {
      std::cerr << "dplb-bench: cannot write " << cli.result_json << '\n';
      return 1;
    }
  }
  return summary.failed == 0 ? 0 : 1;
}
