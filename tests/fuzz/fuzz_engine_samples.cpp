// libFuzzer target for the /metrics page reader, dplb::upstream::parse_engine_samples (an engine's page is
// network input like any other). Checks, for every input:
//  - the invariants of the samples: engines strictly increasing and at most max_engine_label (one entry
//    per engine, bounded memory), counts finite and not negative, KV cache usage in [0, 1], and every
//    entry backed by something (counts, or a KV cache usage);
//  - line-by-line consistency: the samples of the page equal what its lines give one by one, merged
//    by the documented rules (sums, max, the older KV name only for an engine without the newer one).
// Any difference traps with a description.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "dplb/upstream/engine_metrics_parser.hpp"

namespace {

using dplb::upstream::engine_sample;

[[noreturn]] void fail(const char* what, std::uint32_t engine) {
  std::fprintf(stderr, "fuzz_engine_samples: %s (engine %u)\n", what, engine);
  __builtin_trap();
}

bool usable_count(double v) { return std::isfinite(v) && v >= 0; }

void check_invariants(const std::vector<engine_sample>& samples) {
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    if (i > 0 && samples[i - 1].engine >= s.engine) fail("engines not strictly increasing", s.engine);
    if (s.engine > dplb::upstream::max_engine_label) fail("engine above max_engine_label", s.engine);
    if (!usable_count(s.running) || !usable_count(s.waiting)) fail("unusable count", s.engine);
    const bool kv_in_range = !s.kv_cache_usage || (*s.kv_cache_usage >= 0 && *s.kv_cache_usage <= 1);
    if (!kv_in_range) fail("KV usage outside [0, 1]", s.engine);
    if (!s.has_counts && (s.running != 0 || s.waiting != 0)) fail("counts without has_counts", s.engine);
    if (!s.has_counts && !s.kv_cache_usage) fail("an entry with nothing in it", s.engine);
  }
}

// The samples of the page rebuilt from its lines read one at a time. Lines are summed in the same order
// as the page's, so the sums are the same doubles.
void check_line_by_line(std::string_view page, const std::vector<engine_sample>& samples) {
  struct merged {
    engine_sample sample;
    std::optional<double> new_kv, old_kv;
  };
  std::map<std::uint32_t, merged> engines;
  while (!page.empty()) {
    const auto eol = page.find('\n');
    const auto line = page.substr(0, eol);
    page.remove_prefix(eol == std::string_view::npos ? page.size() : eol + 1);
    const auto one = dplb::upstream::parse_engine_samples(line);
    if (one.size() > 1) fail("one line gave several engines", one[1].engine);
    if (one.empty()) continue;
    const auto& s = one[0];
    auto& m = engines[s.engine];
    m.sample.engine = s.engine;
    m.sample.running += s.running;
    m.sample.waiting += s.waiting;
    m.sample.has_counts |= s.has_counts;
    // A line's KV usage comes from one of the two names, the one the line starts with (after blanks).
    if (s.kv_cache_usage) {
      const auto name = line.substr(std::min(line.find_first_not_of(" \t"), line.size()));
      auto& kv = name.starts_with("vllm:kv_cache_usage_perc") ? m.new_kv : m.old_kv;
      kv = std::max(kv.value_or(0.0), *s.kv_cache_usage);
    }
  }
  std::size_t i = 0;
  for (auto& [engine, m] : engines) {
    m.sample.kv_cache_usage = m.new_kv ? m.new_kv : m.old_kv;
    if (i >= samples.size() || !(samples[i] == m.sample)) fail("page differs from its lines merged", engine);
    ++i;
  }
  if (i != samples.size()) fail("page has engines its lines do not", samples[i].engine);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view page(reinterpret_cast<const char*>(data), size);
  const auto samples = dplb::upstream::parse_engine_samples(page);
  check_invariants(samples);
  check_line_by_line(page, samples);
  return 0;
}
