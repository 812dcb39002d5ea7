// run_report's counts and the summary of a run, in vllm bench serve's terms and layout.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>

#include "loadgen.hpp"

namespace dplb::loadgen {

std::size_t run_report::succeeded() const {
  return static_cast<std::size_t>(
      std::count_if(results.begin(), results.end(), [](const request_result& r) { return r.ok; }));
}

std::size_t run_report::failed() const { return results.size() - succeeded(); }

std::map<int, std::size_t> run_report::rank_counts() const {
  std::map<int, std::size_t> counts;
  int highest = -1;
  for (const auto& r : results) {
    if (r.status == 0) continue;  // never reached a rank
    ++counts[r.rank];
    highest = std::max(highest, r.rank);
  }
  // A rank that got nothing is the imbalance worth seeing, so it shows as 0 rather than not at all.
  for (int rank = 0; rank <= highest; ++rank) counts.try_emplace(rank, 0);
  return counts;
}

namespace {

// numpy's default percentile: linear interpolation between the closest ranks.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double position = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto low = static_cast<std::size_t>(std::floor(position));
  const auto high = static_cast<std::size_t>(std::ceil(position));
  return sorted[low] + (sorted[high] - sorted[low]) * (position - static_cast<double>(low));
}

latency_stats stats_ms(std::vector<double> seconds) {
  latency_stats s;
  s.samples = seconds.size();
  if (seconds.empty()) return s;
  std::sort(seconds.begin(), seconds.end());
  s.mean_ms = std::accumulate(seconds.begin(), seconds.end(), 0.0) / static_cast<double>(seconds.size()) * 1e3;
  s.median_ms = percentile(seconds, 50) * 1e3;
  s.p99_ms = percentile(seconds, 99) * 1e3;
  return s;
}

double seconds_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Content events per whole second since the first successful start, as vllm counts "peak output
// token throughput" (each event's time rebuilt from TTFT and the gaps).
double peak_events_per_second(const std::vector<const request_result*>& ok) {
  if (ok.empty()) return 0;
  auto origin = ok.front()->start;
  for (const auto* r : ok) origin = std::min(origin, r->start);
  std::vector<double> buckets;
  for (const auto* r : ok) {
    if (r->events == 0) continue;
    double at = seconds_between(origin, r->start) + r->ttft_s;
    const auto count = [&](double t) {
      const auto bucket = static_cast<std::size_t>(std::max(0.0, t));
      if (bucket >= buckets.size()) buckets.resize(bucket + 1, 0.0);
      buckets[bucket] += 1;
    };
    count(at);
    for (double gap : r->itl_s) count(at += gap);
  }
  return buckets.empty() ? 0.0 : *std::max_element(buckets.begin(), buckets.end());
}

// The most requests in flight at one instant (vllm buckets by second; an instant is exact and cannot
// count two requests that never overlapped).
std::size_t peak_in_flight(const std::vector<const request_result*>& ok) {
  std::vector<std::pair<double, int>> edges;
  edges.reserve(ok.size() * 2);
  if (ok.empty()) return 0;
  const auto origin = ok.front()->start;
  for (const auto* r : ok) {
    const double begin = seconds_between(origin, r->start);
    edges.emplace_back(begin, +1);
    edges.emplace_back(begin + r->e2e_s, -1);
  }
  std::sort(edges.begin(), edges.end());  // at one time, an end (-1) sorts before a start
  long now = 0, peak = 0;  // signed: a zero-length request's end sorts before its start
  for (const auto& [t, step] : edges) {
    now += step;
    peak = std::max(peak, now);
  }
  return static_cast<std::size_t>(peak);
}

// One vllm line: a 40-column label, then the value.
void line(std::string& out, const std::string& label, const std::string& value) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, "%-40s %s\n", label.c_str(), value.c_str());
  out += buffer;
}

std::string fixed(double value, int decimals = 2) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string centered(const std::string& title, char fill, std::size_t width = 50) {
  if (title.size() >= width) return title + "\n";
  const std::size_t pad = width - title.size();
  return std::string(pad / 2, fill) + title + std::string(pad - pad / 2, fill) + "\n";
}

void latency_block(std::string& out, const std::string& title, const std::string& name, const latency_stats& s) {
  out += centered(title, '-');
  line(out, "Mean " + name + " (ms):", fixed(s.mean_ms));
  line(out, "Median " + name + " (ms):", fixed(s.median_ms));
  line(out, "P99 " + name + " (ms):", fixed(s.p99_ms));
}

}  // namespace

summary summarize(const run_report& report) {
  summary s;
  s.duration_s = report.duration_s;
  std::vector<const request_result*> ok;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const auto& r : report.results) {
    if (!r.ok) {
      ++s.failed;
      if (s.errors.size() < 32 || s.errors.count(r.error) != 0) ++s.errors[r.error];
      else ++s.errors["(other errors)"];
      continue;
    }
    ++s.completed;
    ok.push_back(&r);
    const std::uint64_t output = r.has_usage ? r.completion_tokens : r.events;
    s.total_input_tokens += r.has_usage ? r.prompt_tokens : r.input_words;
    s.total_output_tokens += output;
    ttft.push_back(r.ttft_s);
    e2el.push_back(r.e2e_s);
    if (output > 1) tpot.push_back((r.e2e_s - r.ttft_s) / static_cast<double>(output - 1));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  if (s.duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / s.duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / s.duration_s;
    s.total_token_throughput = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / s.duration_s;
  }
  s.peak_output_throughput = peak_events_per_second(ok);
  s.peak_concurrency = peak_in_flight(ok);
  s.ttft = stats_ms(std::move(ttft));
  s.tpot = stats_ms(std::move(tpot));
  s.itl = stats_ms(std::move(itl));
  s.e2el = stats_ms(std::move(e2el));
  s.per_rank = report.rank_counts();
  std::size_t low = SIZE_MAX, high = 0;
  for (const auto& [rank, count] : s.per_rank) {
    if (rank < 0) continue;
    low = std::min(low, count);
    high = std::max(high, count);
  }
  s.rank_spread = low == SIZE_MAX ? 0 : high - low;
  return s;
}

std::string format_summary(const summary& s) {
  std::string out;
  out += centered(" Serving Benchmark Result ", '=');
  line(out, "Successful requests:", std::to_string(s.completed));
  line(out, "Failed requests:", std::to_string(s.failed));
  line(out, "Benchmark duration (s):", fixed(s.duration_s));
  line(out, "Total input tokens:", std::to_string(s.total_input_tokens));
  line(out, "Total generated tokens:", std::to_string(s.total_output_tokens));
  line(out, "Request throughput (req/s):", fixed(s.request_throughput));
  line(out, "Output token throughput (tok/s):", fixed(s.output_throughput));
  line(out, "Peak output token throughput (tok/s):", fixed(s.peak_output_throughput));
  line(out, "Peak concurrent requests:", std::to_string(s.peak_concurrency));
  line(out, "Total Token throughput (tok/s):", fixed(s.total_token_throughput));
  latency_block(out, "Time to First Token", "TTFT", s.ttft);
  latency_block(out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot);
  latency_block(out, "Inter-token Latency", "ITL", s.itl);
  latency_block(out, "End-to-end Latency", "E2EL", s.e2el);

  out += centered("Per-rank requests (x-dplb-rank)", '-');
  std::size_t total = 0;
  for (const auto& [rank, count] : s.per_rank) total += count;
  for (const auto& [rank, count] : s.per_rank) {
    const double share = total == 0 ? 0.0 : 100.0 * static_cast<double>(count) / static_cast<double>(total);
    const std::string label = rank < 0 ? "no x-dplb-rank header:" : "rank " + std::to_string(rank) + ":";
    line(out, label, std::to_string(count) + " (" + fixed(share, 1) + "%)");
  }
  if (s.per_rank.empty()) line(out, "(no responses)", "");
  line(out, "max-min:", std::to_string(s.rank_spread));

  if (!s.errors.empty()) {
    out += centered("Failures", '-');
    for (const auto& [message, count] : s.errors) {
      out += std::to_string(count) + " x " + message + "\n";
    }
  }
  out.append(50, '=');
  out += '\n';
  return out;
}

nlohmann::json to_json(const summary& s, const run_report& report) {
  nlohmann::json j;
  j["model_id"] = report.model;
  j["num_prompts"] = report.results.size();
  j["duration"] = s.duration_s;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["request_throughput"] = s.request_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  j["max_output_tokens_per_s"] = s.peak_output_throughput;
  j["max_concurrent_requests"] = s.peak_concurrency;
  const auto put = [&](const std::string& name, const latency_stats& l) {
    j["mean_" + name + "_ms"] = l.mean_ms;
    j["median_" + name + "_ms"] = l.median_ms;
    j["p99_" + name + "_ms"] = l.p99_ms;
  };
  put("ttft", s.ttft);
  put("tpot", s.tpot);
  put("itl", s.itl);
  put("e2el", s.e2el);
  auto per_rank = nlohmann::json::object();
  for (const auto& [rank, count] : s.per_rank) per_rank[std::to_string(rank)] = count;
  j["per_rank"] = std::move(per_rank);
  j["rank_max_min"] = s.rank_spread;
  // Per request, in request order (as `vllm bench serve --save-detailed` has them): the prompt words sent and
  // the TTFT in seconds (null for a failed request), so that a caller can split the TTFT by request class.
  auto input_lens = nlohmann::json::array();
  auto ttfts = nlohmann::json::array();
  for (const auto& r : report.results) {
    input_lens.push_back(r.input_words);
    ttfts.push_back(r.ok ? nlohmann::json(r.ttft_s) : nlohmann::json(nullptr));
  }
  j["input_lens"] = std::move(input_lens);
  j["ttfts"] = std::move(ttfts);
  // With shared prefixes, each request's group (null without one), to split the figures by group.
  const bool grouped = std::any_of(report.results.begin(), report.results.end(),
                                   [](const request_result& r) { return r.prefix_group >= 0; });
  if (grouped) {
    auto groups = nlohmann::json::array();
    for (const auto& r : report.results) {
      groups.push_back(r.prefix_group >= 0 ? nlohmann::json(r.prefix_group) : nlohmann::json(nullptr));
    }
    j["groups"] = std::move(groups);
  }
  j["errors"] = s.errors;
  if (!report.error.empty()) j["setup_error"] = report.error;
  return j;
}

}  // namespace dplb::loadgen
