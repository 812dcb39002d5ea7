#include "dplb/upstream/engine_metrics_parser.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

namespace dplb::upstream {

namespace {

constexpr std::string_view running_name = "vllm:num_requests_running";
constexpr std::string_view waiting_name = "vllm:num_requests_waiting";
constexpr std::string_view kv_usage_name = "vllm:kv_cache_usage_perc";
constexpr std::string_view old_kv_usage_name = "vllm:gpu_cache_usage_perc";  // before vLLM renamed it

// One sample line: the metric name, the text between the label set's braces (empty without labels),
// and a usable value (finite, not negative).
struct sample {
  std::string_view name;
  std::string_view labels;
  double value = 0;
};

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trim_blanks(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  return s;
}

// The length of a label set's text from just after its '{' to its '}', which is the first '}' outside
// quotes (a label value may hold any character but an unescaped quote); npos when it never closes.
std::size_t label_set_length(std::string_view s) {
  bool quoted = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && quoted) ++i;
    else if (s[i] == '"') quoted = !quoted;
    else if (s[i] == '}' && !quoted) return i;
  }
  return std::string_view::npos;
}

// The value at the start of `s`, up to the first blank; what follows it (a timestamp) is not read.
std::optional<double> read_value(std::string_view s) {
  s = s.substr(0, std::min(s.find(' '), s.find('\t')));
  if (s.starts_with('+')) s.remove_prefix(1);  // from_chars takes no '+'; "+Inf" still fails isfinite
  double value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size() || !std::isfinite(value) || value < 0) return std::nullopt;
  return value;
}

// One line of the page as a sample; nullopt for comments, blank lines, malformed lines and unusable
// values.
std::optional<sample> read_sample(std::string_view line) {
  if (line.ends_with('\r')) line.remove_suffix(1);
  line = trim_blanks(line);
  if (line.empty() || line.starts_with('#')) return std::nullopt;
  sample out;
  const auto name_end = std::min(line.find('{'), std::min(line.find(' '), line.find('\t')));
  if (name_end == std::string_view::npos || name_end == 0) return std::nullopt;
  out.name = line.substr(0, name_end);
  line.remove_prefix(name_end);
  if (line.starts_with('{')) {
    const auto length = label_set_length(line.substr(1));
    if (length == std::string_view::npos) return std::nullopt;
    out.labels = line.substr(1, length);
    line.remove_prefix(length + 2);
  }
  if (line.empty() || !is_blank(line.front())) return std::nullopt;
  const auto value = read_value(trim_blanks(line));
  if (!value) return std::nullopt;
  out.value = *value;
  return out;
}

// Calls on_sample for every usable sample line of the page.
template <typename OnSample>
void for_each_sample(std::string_view text, OnSample&& on_sample) {
  while (!text.empty()) {
    const auto eol = text.find('\n');
    const auto line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (const auto s = read_sample(line)) on_sample(*s);
  }
}

// A label looked up in a label set: whether the set could be read, and the label's raw value if it is
// there. Escapes are left as they are: the only label read is a number, which has none.
struct label_lookup {
  bool readable = true;
  std::optional<std::string_view> value;
};

// Looks up label `name` in a label set (`a="x",b="y"`, blanks around the parts and a trailing comma
// allowed). A set with the label twice is unreadable, as Prometheus rejects it.
label_lookup find_label(std::string_view labels, std::string_view name) {
  constexpr label_lookup unreadable{false, std::nullopt};
  label_lookup found;
  for (labels = trim_blanks(labels); !labels.empty(); labels = trim_blanks(labels)) {
    const auto eq = labels.find('=');
    if (eq == std::string_view::npos) return unreadable;
    auto label = labels.substr(0, eq);
    while (!label.empty() && is_blank(label.back())) label.remove_suffix(1);
    labels = trim_blanks(labels.substr(eq + 1));
    if (!labels.starts_with('"')) return unreadable;
    labels.remove_prefix(1);
    std::size_t quote = 0;  // the closing quote: the first one not escaped
    while (quote < labels.size() && labels[quote] != '"') quote += labels[quote] == '\\' ? 2 : 1;
    if (quote >= labels.size()) return unreadable;
    if (label == name) {
      if (found.value) return unreadable;
      found.value = labels.substr(0, quote);
    }
    labels = trim_blanks(labels.substr(quote + 1));
    if (labels.starts_with(',')) labels.remove_prefix(1);
    else if (!labels.empty()) return unreadable;
  }
  return found;
}

// The engine a series belongs to: its engine label, 0 without one; nullopt when the label is not a
// decimal integer in [0, max_engine_label] or the label set cannot be read.
std::optional<std::uint32_t> engine_of(std::string_view labels) {
  const auto [readable, raw] = find_label(labels, "engine");
  if (!readable) return std::nullopt;
  if (!raw) return 0;
  std::uint32_t engine = 0;
  const auto [end, ec] = std::from_chars(raw->data(), raw->data() + raw->size(), engine);
  if (ec != std::errc{} || end != raw->data() + raw->size() || engine > max_engine_label) return std::nullopt;
  return engine;
}

std::uint32_t to_count(double sum) {
  return sum >= 4e9 ? 4'000'000'000u : static_cast<std::uint32_t>(std::llround(sum));
}

// What parse_engine_samples() gathers for one engine before choosing between the two KV cache names.
struct engine_tally {
  engine_sample sample;
  std::optional<double> old_kv_cache_usage;
};

// The tallies of the engines seen so far, in order of first appearance, and where each engine's is: a
// fixed 8 KiB index, so memory grows with the engines a page shows, whatever their label values.
class engine_tallies {
 public:
  engine_tally& of(std::uint32_t engine) {
    auto& slot = slot_of_[engine];
    if (slot == 0) {
      tallies_.emplace_back().sample.engine = engine;
      slot = static_cast<std::uint16_t>(tallies_.size());
    }
    return tallies_[slot - 1];
  }
  std::vector<engine_tally>& all() { return tallies_; }

 private:
  std::array<std::uint16_t, max_engine_label + 1> slot_of_{};  // 1 + index in tallies_, 0: not seen
  std::vector<engine_tally> tallies_;
};

void max_into(std::optional<double>& into, double value) {
  into = std::max(into.value_or(0.0), std::min(value, 1.0));
}

}  // namespace

std::vector<engine_sample> parse_engine_samples(std::string_view text) {
  engine_tallies tallies;
  for_each_sample(text, [&](const sample& s) {
    const bool counts = s.name == running_name || s.name == waiting_name;
    if (!counts && s.name != kv_usage_name && s.name != old_kv_usage_name) return;
    const auto engine = engine_of(s.labels);
    if (!engine) return;
    auto& t = tallies.of(*engine);
    if (s.name == running_name) t.sample.running += s.value;
    else if (s.name == waiting_name) t.sample.waiting += s.value;
    else if (s.name == kv_usage_name) max_into(t.sample.kv_cache_usage, s.value);
    else max_into(t.old_kv_cache_usage, s.value);
    t.sample.has_counts |= counts;
  });
  std::vector<engine_sample> samples;
  samples.reserve(tallies.all().size());
  for (auto& t : tallies.all()) {
    if (!t.sample.kv_cache_usage) t.sample.kv_cache_usage = t.old_kv_cache_usage;
    samples.push_back(t.sample);
  }
  std::sort(samples.begin(), samples.end(), [](const auto& a, const auto& b) { return a.engine < b.engine; });
  return samples;
}

balancer::engine_load load_of(const engine_sample& sample) {
  return {to_count(sample.waiting), to_count(sample.running), sample.kv_cache_usage.value_or(0.0)};
}

}  // namespace dplb::upstream
