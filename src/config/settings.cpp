#include "dplb/config/settings.hpp"

#include "dplb/balancer/policy_factory.hpp"

#include <boost/program_options.hpp>
#include <boost/url/ipv4_address.hpp>
#include <boost/url/ipv6_address.hpp>
#include <boost/url/parse.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <system_error>

#ifndef DPLB_VERSION
#error "DPLB_VERSION must be defined by the build (see CMakeLists.txt)"
#endif

extern char** environ;

namespace dplb::config {
namespace {

namespace po = boost::program_options;
using json = nlohmann::json;

// Accepted values of the enumerated options. Each list is the single place to extend: --help, the error
// messages and the docs' wording are all generated from it.
using balancer::policy_names;
// spdlog's level names (spdlog::level::from_str); "warning" and "err" aliases are left out so that one
// spelling is documented.
constexpr std::array<std::string_view, 7> log_level_names{"trace", "debug", "info",    "warn",
                                                          "error", "critical", "off"};
constexpr std::array<std::string_view, 2> log_format_names{"text", "json"};

// A day: longer than any sane generation, and small enough that adding it to a steady_clock time point can
// never overflow.
constexpr std::uint64_t max_timeout_ms = 86'400'000;

enum class value_kind {
  flag,      // --help, --version: command line only, no value
  text,      // free text validated by the option's own setter
  choice,    // one of `choices`
  number,    // unsigned integer in [min, max]
  decimal,   // a number with a fraction, validated by the option's own setter
  url_list,  // the backends: repeatable, comma-separated, taken whole from one source
};

// One option's value as found in the source that wins, with what an error message needs to point at it.
struct raw_value {
  std::vector<std::string> texts;  // one entry, except for url_list
  std::string origin;              // "" for the command line, else " (from ...)"
};

struct option_spec {
  std::string_view flag{};        // long name without the leading "--"
  std::string_view env{};         // "" = not settable from the environment
  std::string_view key{};         // "" = not settable from the config file
  std::string_view value_name{};  // shown in --help; choices are listed instead when empty
  std::string_view meaning{};     // --help text
  value_kind kind = value_kind::text;
  std::span<const std::string_view> choices{};
  std::uint64_t min = 0;
  std::uint64_t max = 0;
  std::string_view unit{};
  // text and choice: stores the (validated) value; text setters return why the value is bad, "" if good.
  std::string (*set_text)(settings&, std::string_view) = nullptr;
  void (*set_number)(settings&, std::uint64_t) = nullptr;
  std::string (*show_default)(const settings&) = nullptr;
};

std::string format_listen(const listen_address& a) {
  const bool v6 = a.host.find(':') != std::string::npos;
  return (v6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Digits only: a sign, spaces or a suffix ("5s") are refused rather than half-parsed.
std::optional<std::uint64_t> parse_unsigned(std::string_view s) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return std::nullopt;
  }
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A duration option's value: whole milliseconds ("250"), or with an explicit unit: "250ms", "2s", "0.1s"
// (at most millisecond precision). Anything else is refused rather than half-parsed.
std::optional<std::uint64_t> parse_milliseconds(std::string_view s) {
  if (s.ends_with("ms")) return parse_unsigned(s.substr(0, s.size() - 2));
  if (!s.ends_with('s')) return parse_unsigned(s);
  s.remove_suffix(1);
  const auto dot = s.find('.');
  const auto whole = parse_unsigned(s.substr(0, dot));
  if (!whole || *whole > max_timeout_ms) return std::nullopt;
  std::uint64_t ms = *whole * 1000;
  if (dot != std::string_view::npos) {
    const auto fraction = s.substr(dot + 1);
    const auto digits = parse_unsigned(fraction);
    if (!digits || fraction.size() > 3) return std::nullopt;
    ms += *digits * (fraction.size() == 1 ? 100 : fraction.size() == 2 ? 10 : 1);
  }
  return ms;
}

// An IPv4 literal or a DNS name (labels of letters, digits, '-' and '_'; '_' because Docker Compose and
// Kubernetes service names use it). Something that looks numeric must be a valid IPv4 address, so that a
// typo like 10.0.0.256 fails here instead of in the resolver.
bool valid_host(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  if (host.find_first_not_of("0123456789.") == std::string_view::npos) {
    return static_cast<bool>(boost::urls::parse_ipv4_address(host));
  }
  if (host.back() == '.') host.remove_suffix(1);  // fully qualified "example.com."
  std::size_t start = 0;
  while (start <= host.size()) {
    const std::size_t dot = std::min(host.find('.', start), host.size());
    const std::string_view label = host.substr(start, dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (unsigned char c : label) {
      if (!std::isalnum(c) && c != '-' && c != '_') return false;
    }
    start = dot + 1;
  }
  return true;
}

std::string parse_listen(std::string_view text, listen_address& out) {
  static constexpr std::string_view expected = "expected HOST:PORT, e.g. 0.0.0.0:8000";
  std::string_view host;
  std::string_view port;
  if (text.starts_with('[')) {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return "expected [IPV6]:PORT, e.g. [::1]:8000";
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    if (!boost::urls::parse_ipv6_address(host)) return "'" + std::string(host) + "' is not an IPv6 address";
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return std::string(expected);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return "an IPv6 address needs brackets, e.g. [::1]:8000";
    }
    if (!valid_host(host)) {
      return "'" + std::string(host) + "' is not an IP address or host name; " + std::string(expected);
    }
  }
  const auto p = parse_unsigned(port);
  if (!p || *p > 65535) return "port must be a number from 0 to 65535 (0 picks a free port)";
  out.host = std::string(host);
  out.port = static_cast<std::uint16_t>(*p);
  return {};
}

// The options after '#' in a backend URL: `dp=N` and `weight=W`, joined by '&', each at most once.
std::string parse_backend_options(std::string_view fragment, backend_spec& out) {
  static constexpr std::string_view expected = "expected #dp=N, #weight=W or #dp=N&weight=W after the URL";
  bool seen_dp = false, seen_weight = false;
  while (!fragment.empty()) {
    const auto amp = std::min(fragment.find('&'), fragment.size());
    const auto item = fragment.substr(0, amp);
    fragment.remove_prefix(std::min(amp + 1, fragment.size()));
    // std::find, not item.find: since parse_backend is exported, GCC 12 inlines differently, loses the
    // bound of `item` and warns of a memchr over SIZE_MAX bytes (-Wstringop-overread, a false positive).
    const auto eq_at = std::find(item.begin(), item.end(), '=');
    const auto eq = eq_at == item.end() ? std::string_view::npos : static_cast<std::size_t>(eq_at - item.begin());
    const auto key = item.substr(0, eq);
    // 0 stands for "missing or not a number": both options refuse it.
    const std::uint64_t value =
        eq == std::string_view::npos ? 0 : parse_unsigned(item.substr(eq + 1)).value_or(0);
    if (key == "dp") {
      if (std::exchange(seen_dp, true)) return "dp is given twice";
      if (value < 1 || value > max_dp_per_backend) {
        return "dp must be the number of DP ranks behind the URL, 1 to " + std::to_string(max_dp_per_backend);
      }
      out.dp = static_cast<std::uint32_t>(value);
    } else if (key == "weight") {
      if (std::exchange(seen_weight, true)) return "weight is given twice";
      if (value < 1 || value > max_backend_weight) {
        return "weight must be a whole number from 1 to " + std::to_string(max_backend_weight) +
               " (to take a backend out of rotation, drain it)";
      }
      out.weight = static_cast<std::uint32_t>(value);
    } else {
      return "unknown option '" + std::string(item) + "'; " + std::string(expected);
    }
  }
  return {};
}

}  // namespace

// Normalising (lower-case host, explicit port, no trailing slash) is what makes the duplicate check, and
// the admin API's lookup by URL, meaningful.
std::string parse_backend(std::string_view text, backend_spec& spec) {
  std::string& out = spec.url;
  static constexpr std::string_view example = "expected a URL like http://127.0.0.1:8100";
  const auto parsed = boost::urls::parse_uri(text);
  if (!parsed) return std::string(example);
  const boost::urls::url_view u = *parsed;
  if (u.scheme_id() == boost::urls::scheme::https) {
    return "https is not supported (dplb talks plain HTTP to the engines); use http://HOST:PORT";
  }
  if (u.scheme_id() != boost::urls::scheme::http) return std::string(example);
  if (!u.has_authority() || u.encoded_host().empty()) return std::string(example);
  if (u.has_userinfo()) {
    return "user info ('user@') is not supported; for DP ranks behind one URL write http://HOST:PORT#dp=N";
  }
  if (!u.encoded_path().empty() && u.encoded_path() != "/") {
    return "a path is not supported; give the engine's base URL, http://HOST:PORT";
  }
  if (u.has_query()) return "a query is not supported; expected http://HOST:PORT";

  std::string host;
  switch (u.host_type()) {
    case boost::urls::host_type::ipv4:
      host = u.host_ipv4_address().to_string();
      break;
    case boost::urls::host_type::ipv6:
      host = "[" + u.host_ipv6_address().to_string() + "]";
      break;
    case boost::urls::host_type::name:
      // Percent-encoded names are legal URLs but no resolver wants them.
      if (!valid_host(u.encoded_host())) {
        return "'" + std::string(u.encoded_host()) + "' is not an IP address or host name";
      }
      host = to_lower(u.encoded_host());
      break;
    default:
      return "unsupported host '" + std::string(u.encoded_host()) + "'; expected http://HOST:PORT";
  }

  std::uint64_t port = 80;  // the scheme's default; vLLM users nearly always give one
  if (u.has_port()) {
    const auto p = parse_unsigned(u.port());
    if (!p || *p == 0 || *p > 65535) return "port must be a number from 1 to 65535";
    port = *p;
  }
  out = "http://" + host + ":" + std::to_string(port);
  if (u.has_fragment()) {
    if (u.encoded_fragment().empty()) return "an empty '#' is not supported; expected #dp=N or #weight=W";
    return parse_backend_options(u.encoded_fragment(), spec);
  }
  return {};
}

namespace {

// A non-negative decimal number, at most 1000 (kv-pressure-weight).
std::string parse_weight(std::string_view text, double& out) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(value) || value < 0 || value > 1000) {
    return "expected a number from 0 to 1000, e.g. 6 or 2.5";
  }
  out = value;
  return {};
}

std::string format_weight(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string join(std::span<const std::string_view> items, std::string_view sep, std::string_view last_sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? last_sep : sep;
    out += items[i];
  }
  return out;
}

// The option table: one row per option, in --help order. Environment names and config keys are spelled out
// (not derived) so that a search for DPLB_LOG_FORMAT lands here; the unit tests check they follow the rule
// DPLB_<FLAG_UPPER_SNAKE> / flag_snake, with "backends" (plural) the one deliberate exception.
// Number options differ only in their names, range and the member they set: these build their rows.
template <auto member>
constexpr option_spec ms_option(std::string_view flag, std::string_view env, std::string_view key, std::uint64_t min,
                                std::uint64_t max, std::string_view meaning) {
  return option_spec{.flag = flag, .env = env, .key = key, .value_name = "MS", .meaning = meaning,
                     .kind = value_kind::number, .min = min, .max = max, .unit = "ms",
                     .set_number = [](settings& s, std::uint64_t n) { s.*member = std::chrono::milliseconds(n); },
                     .show_default = [](const settings& s) { return std::to_string((s.*member).count()); }};
}

template <auto member>
constexpr option_spec count_option(std::string_view flag, std::string_view env, std::string_view key,
                                   std::string_view value_name, std::uint64_t min, std::uint64_t max,
                                   std::string_view unit, std::string_view meaning) {
  return option_spec{.flag = flag, .env = env, .key = key, .value_name = value_name, .meaning = meaning,
                     .kind = value_kind::number, .min = min, .max = max, .unit = unit,
                     .set_number =
                         [](settings& s, std::uint64_t n) {
                           s.*member = static_cast<std::remove_cvref_t<decltype(s.*member)>>(n);
                         },
                     .show_default = [](const settings& s) { return std::to_string(s.*member); }};
}

constexpr std::array option_table{
    option_spec{.flag = "help", .meaning = "Print this help and exit.", .kind = value_kind::flag},
    option_spec{.flag = "version", .meaning = "Print the version and exit.", .kind = value_kind::flag},
    option_spec{.flag = "check-config",
                .meaning = "Check the configuration (command line, environment, config file) and exit: 0 with a "
                           "summary when dplb would start with it, 2 with the error otherwise. Nothing is "
                           "resolved, bound or started, so a file for another host can be checked here.",
                .kind = value_kind::flag},
    option_spec{
        .flag = "listen",
        .env = "DPLB_LISTEN",
        .key = "listen",
        .value_name = "HOST:PORT",
        .meaning = "Address to accept clients on: an IP address or host name and a port; IPv6 in brackets "
                   "([::1]:8000); port 0 picks a free port.",
        .set_text = [](settings& s, std::string_view v) { return parse_listen(v, s.listen); },
        .show_default = [](const settings& s) { return format_listen(s.listen); }},
    option_spec{
        .flag = "backend",
        .env = "DPLB_BACKENDS",
        .key = "backends",
        .value_name = "URL",
        .meaning = "Engine base URL, http://HOST:PORT (port 80 if omitted), optionally followed by "
                   "#dp=N (N DP ranks behind the URL, as `vllm serve --data-parallel-size N` serves them: dplb "
                   "tells each request's rank in X-data-parallel-rank: 0..N-1) and/or #weight=W (each of its "
                   "ranks gets W times the share of a weight-1 rank), e.g. http://h:8000#dp=4&weight=2. "
                   "Repeatable, and a value may be a comma-separated list; ranks are numbered in this order "
                   "over all backends (A#dp=2 then B: ranks 0 and 1 on A, 2 on B). Required, unless the config "
                   "file defines clusters (see --config).",
        .kind = value_kind::url_list,
        .show_default = [](const settings&) { return std::string("none (required)"); }},
    option_spec{.flag = "policy",
                .env = "DPLB_POLICY",
                .key = "policy",
                .meaning = "How to pick a rank for each request; every policy honours the backends' weights. "
                           "least-inflight: the rank with the fewest requests dplb has in flight there, ties taken "
                           "in turn; round-robin: each rank in turn; least-load: dplb's in-flight count plus the "
                           "load the engine reports (running + waiting, from its /metrics) beyond what dplb had in "
                           "flight there at that read, plus --kv-pressure-weight * waiting * max(0, KV-cache usage "
                           "- 0.5): vLLM's score, never below what dplb knows it sent; least-tokens: the "
                           "fewest tokens outstanding (prompt tokens until the first response byte, plus "
                           "max_tokens or --default-max-tokens until the end); prefix-aware: the rank that was sent the longest "
                           "prefix of the request's prompt (at least --prefix-min-match), while it is within "
                           "--load-bound, else least-inflight. Baselines for benchmarks, not for "
                           "serving: random, and engine-stats (lowest 4*waiting+running from the engines' "
                           "/metrics, read every --stats-interval, as vLLM's own client balances).",
                .kind = value_kind::choice,
                .choices = policy_names,
                .set_text = [](settings& s, std::string_view v) { return (s.policy = v, std::string()); },
                .show_default = [](const settings& s) { return s.policy; }},
    option_spec{.flag = "stats-interval",
                .env = "DPLB_STATS_INTERVAL",
                .key = "stats_interval",
                .value_name = "MS",
                .meaning = "How often every backend's /metrics is read for its engines' running, waiting and "
                           "KV-cache numbers (exported as dplb_engine_*; least-load and engine-stats balance on "
                           "them). vLLM's DP coordinator publishes every 100 ms. Numbers older than 3 intervals "
                           "plus --health-check-timeout-ms are stale and ignored. By default the engines are read "
                           "only for a policy that uses the numbers (a busy vLLM API server spends real time "
                           "rendering /metrics); set it to read them under any policy. 0 = never.",
                .kind = value_kind::number,
                .min = 0,
                .max = max_timeout_ms,
                .unit = "ms",
                .set_number = [](settings& s, std::uint64_t n) { s.stats_interval = std::chrono::milliseconds(n); },
                .show_default =
                    [](const settings&) { return std::string("100 with least-load or engine-stats, else 0"); }},
    option_spec{.flag = "kv-pressure-weight",
                .env = "DPLB_KV_PRESSURE_WEIGHT",
                .key = "kv_pressure_weight",
                .value_name = "W",
                .meaning = "least-load: the weight of KV-cache pressure, W * waiting * max(0, usage - 0.5), added to "
                           "a rank's load (vLLM's balancer uses 6); 0 ignores the KV cache.",
                .kind = value_kind::decimal,
                .set_text = [](settings& s, std::string_view v) { return parse_weight(v, s.kv_pressure_weight); },
                .show_default = [](const settings& s) { return format_weight(s.kv_pressure_weight); }},
    count_option<&settings::default_max_tokens>("default-max-tokens", "DPLB_DEFAULT_MAX_TOKENS", "default_max_tokens", "N", 1, 10'000'000, "tokens",
                                  "least-tokens: the generation a request is assumed to cost when it sets neither "
                                  "max_tokens nor max_completion_tokens."),
    option_spec{.flag = "load-bound",
                .env = "DPLB_LOAD_BOUND",
                .key = "load_bound",
                .value_name = "C",
                .meaning = "prefix-aware and --affinity-header: a rank takes a request for its prefix or session "
                           "only while its requests in flight stay within C times its fair share of all in flight "
                           "(this one included, rounded up; consistent hashing with bounded loads). Lower keeps "
                           "the ranks even, higher keeps more requests where their cache is. From 1 to 100.",
                .kind = value_kind::decimal,
                .set_text = [](settings& s, std::string_view v) {
                  double c = 0;
                  if (auto error = parse_weight(v, c); !error.empty() || c < 1 || c > 100)
                    return std::string("expected a number from 1 to 100, e.g. 1.25");
                  s.load_bound = c;
                  return std::string();
                },
                .show_default = [](const settings& s) { return format_weight(s.load_bound); }},
    count_option<&settings::prefix_min_match>("prefix-min-match", "DPLB_PREFIX_MIN_MATCH", "prefix_min_match", "TOKENS", 16, 1'000'000, "tokens",
                                  "prefix-aware: the shortest matched prefix that sends a request to the rank that "
                                  "saw it, in tokens estimated at 4 bytes each (matches count in blocks of 64, rounded up)."),
    count_option<&settings::prefix_index_blocks>("prefix-index-blocks", "DPLB_PREFIX_INDEX_BLOCKS", "prefix_index_blocks", "N", 1, 1u << 24, "blocks",
                                  "prefix-aware: prompt blocks (256 bytes, about 64 tokens, each) remembered per rank; "
                                  "the least recently used go first. About 50 bytes of memory each: the default holds about "
                                  "1 Mi tokens of prefixes per rank in under 1 MiB."),
    option_spec{.flag = "affinity-header",
                .env = "DPLB_AFFINITY_HEADER",
                .key = "affinity_header",
                .value_name = "NAME",
                .meaning = "Session affinity, under any policy: requests with the same value of this header (e.g. "
                           "x-session-id) go to the same rank, by consistent hashing with bounded loads "
                           "(--load-bound), so that a conversation stays where its KV cache is without making a "
                           "hot spot; few sessions move when ranks come or go. Requests without it follow the "
                           "policy. Off by default.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty() || v.find_first_of(" \t:\r\n") != std::string_view::npos)
                    return std::string("expected a header name, e.g. x-session-id");
                  s.affinity_header = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    ms_option<&settings::slow_start>("slow-start", "DPLB_SLOW_START", "slow_start", 0, max_timeout_ms,
                                  "A rank readmitted after failed health checks or an ejection starts at a tenth of "
                                  "its weight and ramps up linearly over this long, so that a cold engine is not "
                                  "flooded. 0 = off."),
    option_spec{.flag = "threads",
                .env = "DPLB_THREADS",
                .key = "threads",
                .value_name = "N",
                .meaning = "Worker threads, each with its own event loop and upstream connections; 0 = one "
                           "per CPU core.",
                .kind = value_kind::number,
                .min = 0,
                .max = 256,
                .unit = "threads",
                .set_number = [](settings& s, std::uint64_t n) { s.threads = static_cast<unsigned>(n); },
                .show_default = [](const settings& s) { return std::to_string(s.threads); }},
    option_spec{.flag = "config",
                .env = "DPLB_CONFIG",
                .value_name = "FILE",
                .meaning = "JSON config file whose keys are the options' names in snake_case; unknown keys "
                           "are an error. Only the file defines model groups, \"clusters\": [{\"name\", \"models\", "
                           "\"backends\", \"policy\", \"default\"}, ...]: a request goes to the cluster that "
                           "lists its body's \"model\", one without a model to the default cluster. A file holds "
                           "\"clusters\" or \"backends\", not both; --backend and DPLB_BACKENDS replace its "
                           "clusters. See docs/configuration.md.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty()) return std::string("expected a file path");
                  s.config_file = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    option_spec{.flag = "log-level",
                .env = "DPLB_LOG_LEVEL",
                .key = "log_level",
                .meaning = "Least severe log messages written.",
                .kind = value_kind::choice,
                .choices = log_level_names,
                .set_text = [](settings& s, std::string_view v) { return (s.log_level = v, std::string()); },
                .show_default = [](const settings& s) { return s.log_level; }},
    option_spec{.flag = "log-format",
                .env = "DPLB_LOG_FORMAT",
                .key = "log_format",
                .meaning = "Log line format: human-readable text or one JSON object per line.",
                .kind = value_kind::choice,
                .choices = log_format_names,
                .set_text =
                    [](settings& s, std::string_view v) {
                      s.log_fmt = v == "json" ? log_format::json : log_format::text;
                      return std::string();
                    },
                .show_default =
                    [](const settings& s) { return std::string(s.log_fmt == log_format::json ? "json" : "text"); }},
    option_spec{.flag = "access-log",
                .env = "DPLB_ACCESS_LOG",
                .key = "access_log",
                .value_name = "PATH",
                .meaning = "Write an access log to PATH ('-': standard output), one JSON object per line and "
                           "request: time, rank, method, path, status, bytes, ttfb, duration, tokens, model, "
                           "client. Written by a thread of its own every 100 ms, never by the event loops: a full "
                           "buffer drops lines (dplb_access_log_dropped_total) rather than slow a request. SIGHUP "
                           "reopens the file (log rotation). Off by default.",
                .set_text = [](settings& s, std::string_view v) {
                  s.access_log = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    count_option<&settings::max_request_body_bytes>("max-request-body-bytes", "DPLB_MAX_REQUEST_BODY_BYTES", "max_request_body_bytes", "BYTES", 1, std::uint64_t{4} << 30, "bytes",
                                  "Largest request body accepted; larger ones get 413."),
    count_option<&settings::max_header_bytes>("max-header-bytes", "DPLB_MAX_HEADER_BYTES", "max_header_bytes", "BYTES", 1, std::uint64_t{64} << 10, "bytes",
                                  "Largest request or response head (start line and headers); larger request heads "
                           "get 431, larger response heads 502. At most 64 KiB: Beast refuses longer header "
                           "fields."),
    ms_option<&settings::client_idle_timeout>("client-idle-timeout-ms", "DPLB_CLIENT_IDLE_TIMEOUT_MS", "client_idle_timeout_ms", 1, max_timeout_ms,
                                  "How long a client connection may take to deliver its next request head, waiting included; "
                                  "then it is closed (an unfinished head counts as 408)."),
    ms_option<&settings::request_read_timeout>("request-read-timeout-ms", "DPLB_REQUEST_READ_TIMEOUT_MS", "request_read_timeout_ms", 1, max_timeout_ms,
                                  "How long a client may take to send a request body once the head has arrived "
                           "(the head itself is bounded by --client-idle-timeout-ms)."),
    ms_option<&settings::upstream_connect_timeout>("upstream-connect-timeout-ms", "DPLB_UPSTREAM_CONNECT_TIMEOUT_MS", "upstream_connect_timeout_ms", 1, max_timeout_ms,
                                  "How long connecting to an engine may take."),
    ms_option<&settings::upstream_read_timeout>("upstream-read-timeout-ms", "DPLB_UPSTREAM_READ_TIMEOUT_MS", "upstream_read_timeout_ms", 1, max_timeout_ms,
                                  "Longest silence allowed from an engine between response bytes (including the "
                           "wait for the first byte)."),
    ms_option<&settings::client_write_timeout>("client-write-timeout-ms", "DPLB_CLIENT_WRITE_TIMEOUT_MS", "client_write_timeout_ms", 1, max_timeout_ms,
                                  "Longest a client may take to accept bytes written to it."),
    ms_option<&settings::upstream_idle_timeout>("upstream-idle-timeout-ms", "DPLB_UPSTREAM_IDLE_TIMEOUT_MS", "upstream_idle_timeout_ms", 1, max_timeout_ms,
                                  "Idle pooled engine connections older than this are closed; keep it below the "
                           "engine's keep-alive (vLLM: 5 s)."),
    count_option<&settings::upstream_max_idle_per_rank>("upstream-max-idle-per-rank", "DPLB_UPSTREAM_MAX_IDLE_PER_RANK", "upstream_max_idle_per_rank", "N", 0, 65536, "connections",
                                  "Most idle connections kept per engine by each worker thread; 0 keeps none."),
    ms_option<&settings::upstream_first_byte_timeout>("upstream-first-byte-timeout-ms", "DPLB_UPSTREAM_FIRST_BYTE_TIMEOUT_MS", "upstream_first_byte_timeout_ms", 0, max_timeout_ms,
                                  "Longest wait for an engine's response head; beyond it the client gets 504 and the request is not re-sent. vLLM sends a stream's head at once but a non-streaming head only after the whole generation: size it for that. 0 = only --upstream-read-timeout-ms."),
    count_option<&settings::max_retries>("max-retries", "DPLB_MAX_RETRIES", "max_retries", "N", 0, 10, "retries",
                                  "Times a request is re-sent to another rank when its rank failed before taking it (connect failed, refused, reset before any answer). Never after a response byte reached the client."),
    ms_option<&settings::health_check_interval>("health-check-interval-ms", "DPLB_HEALTH_CHECK_INTERVAL_MS", "health_check_interval_ms", 0, max_timeout_ms,
                                  "Interval of the active health checks (GET /health on every rank); 0 turns them off."),
    ms_option<&settings::health_check_timeout>("health-check-timeout-ms", "DPLB_HEALTH_CHECK_TIMEOUT_MS", "health_check_timeout_ms", 1, max_timeout_ms,
                                  "Longest a health check may take (connect and answer); slower counts as failed."),
    count_option<&settings::unhealthy_threshold>("unhealthy-threshold", "DPLB_UNHEALTHY_THRESHOLD", "unhealthy_threshold", "N", 1, 1000, "checks",
                                  "Consecutive failed health checks that take a rank down."),
    count_option<&settings::healthy_threshold>("healthy-threshold", "DPLB_HEALTHY_THRESHOLD", "healthy_threshold", "N", 1, 1000, "checks",
                                  "Consecutive good health checks that bring a down rank back."),
    count_option<&settings::ejection_threshold>("ejection-threshold", "DPLB_EJECTION_THRESHOLD", "ejection_threshold", "N", 0, 100000, "requests",
                                  "Consecutive failed requests (connect failure, reset, timeout, 5xx) that eject a rank; 0 = never eject."),
    ms_option<&settings::ejection_base>("ejection-base-ms", "DPLB_EJECTION_BASE_MS", "ejection_base_ms", 1, max_timeout_ms,
                                  "How long the first ejection lasts; each repeat doubles it."),
    ms_option<&settings::ejection_max>("ejection-max-ms", "DPLB_EJECTION_MAX_MS", "ejection_max_ms", 1, max_timeout_ms,
                                  "Longest ejection; a rank clean for this long has its ejection history forgiven."),
    count_option<&settings::max_ejected_percent>("max-ejected-percent", "DPLB_MAX_EJECTED_PERCENT", "max_ejected_percent", "PERCENT", 0, 100, "%",
                                  "Most ranks ejected at once, as a share of all ranks (passive ejection never takes more out, however many fail together)."),
    count_option<&settings::max_inflight_per_rank>("max-inflight-per-rank", "DPLB_MAX_INFLIGHT_PER_RANK", "max_inflight_per_rank", "N", 0, 1000000, "requests",
                                  "Requests in flight a rank may hold; when every usable rank is full, requests wait in dplb (FIFO) for the first free slot. 0 = no limit and no queueing."),
    count_option<&settings::max_queued_requests>("max-queued-requests", "DPLB_MAX_QUEUED_REQUESTS", "max_queued_requests", "N", 0, 10000000, "requests",
                                  "Most requests waiting in dplb's queue (with --max-inflight-per-rank); beyond it new requests get 429."),
    ms_option<&settings::queue_timeout>("queue-timeout-ms", "DPLB_QUEUE_TIMEOUT_MS", "queue_timeout_ms", 1, max_timeout_ms,
                                  "Longest a request waits in dplb's queue; then it gets 503."),
    count_option<&settings::max_client_connections>("max-client-connections", "DPLB_MAX_CLIENT_CONNECTIONS", "max_client_connections", "N", 1, 10000000, "connections",
                                  "Most client connections open at once; beyond it new connections get 503 and are closed."),
    ms_option<&settings::drain_timeout>("drain-timeout-ms", "DPLB_DRAIN_TIMEOUT_MS", "drain_timeout_ms", 1, max_timeout_ms,
                                  "On SIGTERM or SIGINT: longest wait for requests in flight to finish before exiting."),
    option_spec{
        .flag = "admin-listen",
        .env = "DPLB_ADMIN_LISTEN",
        .key = "admin_listen",
        .value_name = "HOST:PORT",
        .meaning = "Serve the admin API (list ranks and backends, add and remove backends, drain and undrain "
                   "ranks or backends, set weights; see docs/operations.md) on this address, a listener of its own: the public port never serves it. "
                   "Needs a token (--admin-token-file or DPLB_ADMIN_TOKEN); bind it to a private address.",
        .set_text = [](settings& s, std::string_view v) { return parse_listen(v, s.admin_listen.emplace()); },
        .show_default = [](const settings&) { return std::string("none (no admin API)"); }},
    option_spec{.flag = "admin-token-file",
                .env = "DPLB_ADMIN_TOKEN_FILE",
                .key = "admin_token_file",
                .value_name = "FILE",
                .meaning = "File holding the admin API's bearer token (surrounding whitespace is ignored). "
                           "Alternatively set the token itself in the environment variable DPLB_ADMIN_TOKEN "
                           "(never on the command line, where `ps` shows it); not both.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty()) return std::string("expected a file path");
                  s.admin_token_file = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
};

const option_spec& find_option(std::string_view flag) {
  for (const auto& o : option_table) {
    if (o.flag == flag) return o;
  }
  throw std::logic_error("dplb: no option --" + std::string(flag));
}

std::string value_name_of(const option_spec& o) {
  return o.kind == value_kind::choice ? join(o.choices, "|", "|") : std::string(o.value_name);
}

// Options are shown in --help with their other two spellings and their default, so that --help alone is
// enough to write an environment or a config file.
po::options_description visible_options() {
  const settings defaults;
  po::options_description desc("Options", 100, 60);
  for (const auto& o : option_table) {
    std::string text(o.meaning);
    if (o.kind == value_kind::number) {
      text += " Range " + std::to_string(o.min) + ".." + std::to_string(o.max) + " " + std::string(o.unit) + ".";
    }
    // Separate short lines, so that wrapping never splits "default" from its value.
    if (!o.env.empty()) text += "\nenv " + std::string(o.env);
    if (!o.key.empty()) text += "\nconfig key \"" + std::string(o.key) + "\"";
    if (o.show_default) text += "\ndefault " + o.show_default(defaults);
    const std::string name(o.flag);
    if (o.kind == value_kind::flag) {
      desc.add_options()(name.c_str(), text.c_str());
    } else {
      desc.add_options()(name.c_str(), po::value<std::string>()->value_name(value_name_of(o)), text.c_str());
    }
  }
  return desc;
}

// Stray words on the command line are collected under this hidden name so that the error can quote them.
constexpr const char* positional_name = "dplb-positional-argument";

// Edit distance, to suggest the option or key that a typo meant.
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

template <typename Names>
std::optional<std::string> closest(std::string_view typo, const Names& names) {
  std::optional<std::string> best;
  std::size_t best_d = std::max<std::size_t>(2, typo.size() / 3) + 1;
  for (std::string_view n : names) {
    if (n.empty()) continue;
    if (const std::size_t d = distance(typo, n); d < best_d) {
      best_d = d;
      best = std::string(n);
    }
  }
  return best;
}

std::string unknown_option_message(std::string_view given) {
  if (const auto eq = given.find('='); eq != std::string_view::npos) given = given.substr(0, eq);
  std::string msg = "unknown option '" + std::string(given) + "'";
  std::string_view bare = given;
  while (bare.starts_with('-')) bare.remove_prefix(1);
  std::vector<std::string_view> flags;
  for (const auto& o : option_table) flags.push_back(o.flag);
  if (auto near = closest(bare, flags)) msg += " (did you mean '--" + *near + "'?)";
  return msg + "; see 'dplb --help'";
}

using command_line_values = std::map<std::string, std::vector<std::string>, std::less<>>;

command_line_values read_command_line(int argc, const char* const* argv) {
  po::options_description all = visible_options();
  all.add_options()(positional_name, po::value<std::string>());
  po::positional_options_description positional;
  positional.add(positional_name, -1);
  // No short options (there are none, and "-listen" must not read as "-l isten") and no guessing of
  // abbreviations: a script that works today must not change meaning when an option is added.
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next;

  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);

  po::parsed_options parsed(nullptr);
  try {
    parsed = po::command_line_parser(args).options(all).positional(positional).style(style).run();
  } catch (const po::unknown_option& e) {
    throw config_error(unknown_option_message(e.get_option_name()));
  } catch (const po::invalid_command_line_syntax& e) {
    if (e.kind() == po::invalid_syntax::missing_parameter) {
      throw config_error("option '" + e.get_option_name() + "' needs a value; see 'dplb --help'");
    }
    if (e.kind() == po::invalid_syntax::empty_adjacent_parameter) {
      throw config_error("option '" + e.get_option_name() + "' needs a value after '='; see 'dplb --help'");
    }
    if (e.kind() == po::invalid_syntax::extra_parameter) {
      throw config_error("option '" + e.get_option_name() + "' takes no value; see 'dplb --help'");
    }
    throw config_error(std::string("invalid command line: ") + e.what() + "; see 'dplb --help'");
  } catch (const po::error& e) {
    throw config_error(std::string("invalid command line: ") + e.what() + "; see 'dplb --help'");
  }

  command_line_values values;
  for (const po::option& opt : parsed.options) {
    const std::string value = opt.value.empty() ? std::string() : opt.value.front();
    if (opt.string_key == positional_name) {
      if (opt.position_key < 0) throw config_error(unknown_option_message("--" + opt.string_key));
      if (value.starts_with('-')) throw config_error(unknown_option_message(value));
      throw config_error("unexpected argument '" + value + "'; options start with '--', see 'dplb --help'");
    }
    // program_options takes the next word as the value even when it is another option, which would turn
    // "--listen --backend URL" into a baffling complaint about URL.
    if (value.starts_with("--") && find_option(opt.string_key).kind != value_kind::flag) {
      throw config_error("option '--" + opt.string_key + "' needs a value; see 'dplb --help'");
    }
    auto& slot = values[opt.string_key];
    if (!slot.empty() && find_option(opt.string_key).kind != value_kind::url_list) {
      // Last-one-wins would hide a mistake in a long command line; only --backend repeats.
      throw config_error("option '--" + opt.string_key + "' given more than once ('" + slot.front() + "' and '" +
                         value + "'); pass it once");
    }
    slot.push_back(value);
  }
  return values;
}

// `what` names the file in errors: "config file", "admin token file".
std::string read_file(const std::string& path, std::string_view what) {
  const std::string cannot = "cannot read " + std::string(what) + " '" + path + "': ";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw config_error(cannot + "it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(cannot + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw config_error(cannot + std::strerror(errno));
  return text.str();
}

// The one key only the config file has: a model group is a structure (models, backends, a policy) that
// neither a flag nor a variable can hold.
constexpr std::string_view clusters_key = "clusters";
// The keys of one cluster's object.
constexpr std::array<std::string_view, 5> cluster_keys{"name", "models", "backends", "policy", "default"};

const option_spec& backend_option() {
  static const option_spec& backend = find_option("backend");
  return backend;
}

// nlohmann keeps the last of two equal keys; a repeated key is as likely a mistake as an unknown one, in the
// file's own object and in the objects inside it (a cluster's two "models" would drop the first silently).
// Fed every event of the parse; `message` holds the error for the first repeat, "" while there is none.
struct repeated_key_finder {
  std::vector<std::set<std::string>> open_objects;  // the keys read so far of each object being parsed
  std::string top_key;                              // the file's key whose value is being parsed
  std::string message;

  bool note(json::parse_event_t event, const json& parsed, const std::string& path) {
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end) open_objects.pop_back();
    if (event != json::parse_event_t::key || !message.empty()) return true;
    const std::string key = parsed.get<std::string>();
    if (open_objects.size() == 1) top_key = key;
    if (open_objects.back().insert(key).second) return true;
    message = "key '" + key + "' appears twice in " +
              (open_objects.size() == 1 ? "" : "an object under '" + top_key + "' in ") + "config file '" + path + "'";
    return true;
  }
};

json parse_config_json(const std::string& text, const std::string& path) {
  repeated_key_finder repeats;
  const json::parser_callback_t note_keys = [&](int, json::parse_event_t event, json& parsed) {
    return repeats.note(event, parsed, path);
  };
  json doc;
  try {
    doc = json::parse(text, note_keys);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " tag: it means nothing to a user.
    if (const auto tag_end = what.find("] "); what.starts_with("[json.") && tag_end != std::string::npos) {
      what.erase(0, tag_end + 2);
    }
    throw config_error("invalid JSON in config file '" + path + "': " + what);
  }
  if (!doc.is_object()) {
    throw config_error("config file '" + path + "' must hold a JSON object, e.g. {\"backends\": [\"http://127.0.0.1:8100\"]}");
  }
  if (!repeats.message.empty()) throw config_error(repeats.message);
  return doc;
}

// `what` names the object in the message: "config file '/etc/dplb.json'", "cluster 'llama' in config file ...".
template <typename Keys>
void refuse_unknown_keys(const json& object, const Keys& known, const std::string& what) {
  for (const auto& item : object.items()) {
    if (std::find(known.begin(), known.end(), item.key()) != known.end()) continue;
    std::string msg = "unknown key '" + item.key() + "' in " + what;
    if (auto near = closest(item.key(), known)) {
      msg += " (did you mean '" + *near + "'?)";
    } else {
      msg += "; known keys: " + join(known, ", ", ", ");
    }
    throw config_error(msg);
  }
}

json read_config_file(const std::string& path) {
  const json doc = parse_config_json(read_file(path, "config file"), path);
  std::vector<std::string_view> keys;
  for (const auto& o : option_table) {
    if (!o.key.empty()) keys.push_back(o.key);
  }
  keys.push_back(clusters_key);
  refuse_unknown_keys(doc, keys, "config file '" + path + "'");
  // Which of the two lists the file meant would be a guess; like an unknown key, refused even when a
  // higher-precedence source replaces both.
  if (doc.contains(clusters_key) && doc.contains(backend_option().key)) {
    throw config_error("config file '" + path + "' has both \"clusters\" and \"backends\"; move the backends into a "
                       "cluster's \"backends\" (or drop \"clusters\")");
  }
  return doc;
}

// A backend list in the file: an array of URL strings or one comma-separated string; nullopt for another type.
std::optional<std::vector<std::string>> url_texts_from_json(const json& node) {
  if (node.is_string()) return std::vector<std::string>{node.get<std::string>()};
  if (!node.is_array()) return std::nullopt;
  std::vector<std::string> texts;
  for (const auto& item : node) {
    if (!item.is_string()) return std::nullopt;
    texts.push_back(item.get<std::string>());
  }
  return texts;
}

std::vector<std::string> texts_from_json(const option_spec& o, const json& node, const std::string& path) {
  const auto wrong_type = [&](std::string_view wanted) {
    return config_error("key '" + std::string(o.key) + "' in config file '" + path + "' must be " +
                        std::string(wanted) + ", not " + node.type_name());
  };
  switch (o.kind) {
    case value_kind::number:
    case value_kind::decimal:
      // A fraction or a negative number is dumped and then refused with the range, like any bad number.
      if (!node.is_number()) throw wrong_type("a number");
      return {node.dump()};
    case value_kind::url_list:
      if (auto texts = url_texts_from_json(node)) return *texts;
      throw wrong_type("an array of URL strings");
    default:
      // A number where text is parsed as one (kv_pressure_weight) may be written as a JSON number.
      if (!node.is_string()) throw wrong_type("a string");
      return {node.get<std::string>()};
  }
}

// Precedence, per option: command line > environment > config file. Only the winning source is validated,
// so that a flag can override a broken environment variable.
std::optional<raw_value> pick(const option_spec& o, const command_line_values& cli, const environment& env,
                              const json& file, const std::string& file_path) {
  if (const auto it = cli.find(o.flag); it != cli.end()) {
    return raw_value{it->second, ""};
  }
  if (!o.env.empty()) {
    // An empty variable counts as unset: container and systemd files often define every variable.
    if (const auto it = env.find(std::string(o.env)); it != env.end() && !it->second.empty()) {
      return raw_value{{it->second}, " (from " + std::string(o.env) + ")"};
    }
  }
  if (!o.key.empty() && file.is_object()) {
    if (const auto it = file.find(o.key); it != file.end()) {
      return raw_value{texts_from_json(o, *it, file_path),
                       " (from key '" + std::string(o.key) + "' in config file '" + file_path + "')"};
    }
  }
  return std::nullopt;
}

[[noreturn]] void bad_value(const option_spec& o, const raw_value& v, std::string_view shown,
                            std::string_view why) {
  throw config_error("invalid --" + std::string(o.flag) + " '" + std::string(shown) + "'" + v.origin + ": " +
                     std::string(why));
}

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// Backends in rank order, from one flat list or from each cluster's list in turn. Refuses an engine listed
// twice, in one list or in two clusters (it would get twice its share, and belong to two policies), and
// more than max_ranks ranks in all.
class rank_list {
 public:
  // Appends the backends of `v` (each text a URL or a comma-separated list) to cluster `cluster`, named
  // `cluster_name` in messages ("" for a flat list).
  void add(const raw_value& v, std::size_t cluster, const std::string& cluster_name) {
    for (const std::string& text : v.texts) {
      std::size_t start = 0;
      while (true) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        const std::string_view entry = trim(std::string_view(text).substr(start, comma - start));
        if (entry.empty()) {
          bad_value(backend_option(), v, text, "empty entry; expected http://HOST:PORT[,http://HOST:PORT...]");
        }
        add_one(v, entry, cluster, cluster_name);
        if (comma == text.size()) break;
        start = comma + 1;
      }
    }
  }

  std::vector<backend_spec> take() && { return std::move(backends_); }

 private:
  struct first_listing {
    std::size_t rank;
    std::string as_written;
    std::string cluster_name;
  };

  void add_one(const raw_value& v, std::string_view entry, std::size_t cluster, const std::string& cluster_name) {
    backend_spec normal;
    if (auto why = parse_backend(entry, normal); !why.empty()) bad_value(backend_option(), v, entry, why);
    normal.cluster = cluster;
    const auto [it, fresh] = first_.emplace(normal.url, first_listing{ranks_, std::string(entry), cluster_name});
    if (!fresh) {
      const first_listing& first = it->second;
      throw config_error("duplicate --backend '" + std::string(entry) + "'" + v.origin + ": same engine as rank " +
                         std::to_string(first.rank) + " ('" + first.as_written + "'" +
                         (first.cluster_name.empty() ? "" : " of cluster '" + first.cluster_name + "'") +
                         "); list each engine once" + (cluster_name.empty() ? "" : ", in one cluster"));
    }
    ranks_ += normal.dp;
    if (ranks_ > max_ranks) {
      throw config_error("too many ranks" + v.origin + ": the backends add up to more than " +
                         std::to_string(max_ranks) + " DP ranks" + (cluster_name.empty() ? "" : " over all clusters"));
    }
    backends_.push_back(std::move(normal));
  }

  std::vector<backend_spec> backends_;
  std::size_t ranks_ = 0;
  std::map<std::string, first_listing> first_;  // normal form -> where the engine was first listed
};

// The canonical spelling of a choice, matched case-insensitively (DPLB_LOG_LEVEL=INFO is a natural thing to
// write); nullopt when it is none of them.
std::optional<std::string_view> canonical_choice(std::span<const std::string_view> choices, std::string_view text) {
  const std::string lower = to_lower(text);
  const auto it = std::find(choices.begin(), choices.end(), lower);
  if (it == choices.end()) return std::nullopt;
  return *it;
}

void apply(const option_spec& o, const raw_value& v, settings& s) {
  switch (o.kind) {
    case value_kind::url_list: {
      rank_list ranks;
      ranks.add(v, 0, "");
      s.backends = std::move(ranks).take();
      return;
    }
    case value_kind::number: {
      const bool duration = o.unit == "ms";
      const auto n = duration ? parse_milliseconds(v.texts.front()) : parse_unsigned(v.texts.front());
      if (!n || *n < o.min || *n > o.max) {
        bad_value(o, v, v.texts.front(),
                  "expected a whole number from " + std::to_string(o.min) + " to " + std::to_string(o.max) + " (" +
                      std::string(o.unit) + ")" + (duration ? ", or a duration such as 250ms or 1.5s" : ""));
      }
      o.set_number(s, *n);
      return;
    }
    case value_kind::choice: {
      const auto choice = canonical_choice(o.choices, v.texts.front());
      if (!choice) bad_value(o, v, v.texts.front(), "expected " + join(o.choices, ", ", " or "));
      o.set_text(s, *choice);
      return;
    }
    case value_kind::text:
    case value_kind::decimal:
      if (auto why = o.set_text(s, v.texts.front()); !why.empty()) bad_value(o, v, v.texts.front(), why);
      return;
    case value_kind::flag:
      return;
  }
}

// --- model groups: the file's "clusters" ---

// A cluster's name labels metrics and log lines, so it keeps to characters every exporter and log parser
// takes as they are.
bool valid_cluster_name(std::string_view name) {
  return !name.empty() && name.size() <= max_cluster_name_length &&
         std::all_of(name.begin(), name.end(), [](unsigned char c) {
           return std::isalnum(c) || c == '.' || c == '_' || c == '-';
         });
}

// One cluster object of the file, with what its error messages call it: "cluster 'llama' in config file
// 'P'" when it has a name, else its place, "clusters[1] in config file 'P'".
struct cluster_source {
  const json& object;
  std::size_t index;
  std::string path;  // of the config file
  std::string place;
  std::string label;

  config_error wrong_type(std::string_view key, std::string_view wanted, const json& value) const {
    return config_error("\"" + std::string(key) + "\" of " + label + " must be " + std::string(wanted) + ", not " +
                        value.type_name());
  }
};

cluster_source cluster_at(const json& clusters, std::size_t index, const std::string& path) {
  const json& object = clusters[index];
  const std::string place = "clusters[" + std::to_string(index) + "] in config file '" + path + "'";
  if (!object.is_object()) {
    throw config_error(place + " must be an object, e.g. {\"name\": \"llama\", \"models\": [...], " +
                       "\"backends\": [...]}, not " + std::string(object.type_name()));
  }
  const auto name = object.find("name");
  const bool named = name != object.end() && name->is_string() && !name->get<std::string>().empty();
  std::string label = named ? "cluster '" + name->get<std::string>() + "' in config file '" + path + "'" : place;
  return {object, index, path, place, std::move(label)};
}

std::string cluster_name_of(const cluster_source& c) {
  const auto name = c.object.find("name");
  if (name == c.object.end()) {
    throw config_error(c.label + " has no \"name\"; give each cluster a name of letters, digits, '.', '_' or '-'");
  }
  if (!name->is_string()) throw c.wrong_type("name", "a string", *name);
  const std::string text = name->get<std::string>();
  if (!valid_cluster_name(text)) {
    throw config_error("invalid \"name\" '" + text + "' of " + c.place + ": use 1 to " +
                       std::to_string(max_cluster_name_length) +
                       " letters, digits, '.', '_' or '-' (it labels the cluster's metrics)");
  }
  return text;
}

// The requests' "model" values the cluster serves, compared exactly as vLLM compares served model names.
std::vector<std::string> cluster_models_of(const cluster_source& c) {
  const auto models = c.object.find("models");
  if (models == c.object.end()) {
    throw config_error(c.label + " has no \"models\"; list the model names it serves (the requests' \"model\")");
  }
  if (!models->is_array()) throw c.wrong_type("models", "an array of model names", *models);
  if (models->empty()) {
    throw config_error("\"models\" of " + c.label + " is empty; list the model names it serves");
  }
  std::vector<std::string> names;
  for (const json& model : *models) {
    if (!model.is_string()) throw c.wrong_type("models", "an array of model names (strings)", model);
    std::string name = model.get<std::string>();
    if (name.empty()) throw config_error("\"models\" of " + c.label + " holds an empty model name; remove it");
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      throw config_error("model '" + name + "' is listed twice in " + c.label + "; list it once");
    }
    names.push_back(std::move(name));
  }
  return names;
}

// The cluster's backends, appended to `ranks` (global rank order) and checked as --backend checks a list.
void add_cluster_backends(const cluster_source& c, const std::string& name, rank_list& ranks) {
  const auto backends = c.object.find("backends");
  if (backends == c.object.end()) {
    throw config_error(c.label + " has no \"backends\"; list the URLs of the engines that serve its models");
  }
  const auto texts = url_texts_from_json(*backends);
  if (!texts) {
    // Name the type of what is wrong: the list itself, or the first entry that is not a string.
    const auto not_text = [](const json& entry) { return !entry.is_string(); };
    const bool list = backends->is_array();
    throw c.wrong_type("backends", "an array of URL strings",
                       list ? *std::find_if(backends->begin(), backends->end(), not_text) : *backends);
  }
  if (texts->empty()) {
    throw config_error("\"backends\" of " + c.label + " is empty; list the URLs of the engines that serve its models");
  }
  ranks.add(raw_value{*texts, " (from \"backends\" of " + c.label + ")"}, c.index, name);
}

// The cluster's own policy, validated as --policy is; the top-level policy when it sets none.
std::string cluster_policy_of(const cluster_source& c, const std::string& default_policy) {
  const auto policy = c.object.find("policy");
  if (policy == c.object.end()) return default_policy;
  if (!policy->is_string()) throw c.wrong_type("policy", "a string", *policy);
  const auto choice = canonical_choice(policy_names, policy->get<std::string>());
  if (!choice) {
    throw config_error("invalid \"policy\" '" + policy->get<std::string>() + "' of " + c.label + ": expected " +
                       join(policy_names, ", ", " or "));
  }
  return std::string(*choice);
}

bool marked_default(const cluster_source& c) {
  const auto mark = c.object.find("default");
  if (mark == c.object.end()) return false;
  if (!mark->is_boolean()) throw c.wrong_type("default", "true or false", *mark);
  return mark->get<bool>();
}

// A model served by two clusters would leave the cluster of its requests to a guess.
void refuse_shared_models(const std::vector<cluster_spec>& clusters, const std::string& path) {
  std::map<std::string_view, std::string_view> cluster_of_model;
  for (const cluster_spec& c : clusters) {
    for (const std::string& model : c.models) {
      const auto [it, fresh] = cluster_of_model.emplace(model, c.name);
      if (!fresh) {
        throw config_error("model '" + model + "' is listed by cluster '" + std::string(it->second) +
                           "' and by cluster '" + c.name + "' in config file '" + path +
                           "'; a model belongs to one cluster");
      }
    }
  }
}

void refuse_shared_name(const std::vector<cluster_spec>& clusters, const std::string& name, const std::string& path) {
  const auto named_so = [&](const cluster_spec& c) { return c.name == name; };
  const auto same = std::find_if(clusters.begin(), clusters.end(), named_so);
  if (same == clusters.end()) return;
  throw config_error("two clusters are named '" + name + "' in config file '" + path + "' (clusters[" +
                     std::to_string(same - clusters.begin()) + "] and clusters[" + std::to_string(clusters.size()) +
                     "]); give each its own name");
}

// One cluster of the file, checked alone and against the clusters before it; its backends go to `ranks`.
cluster_spec read_cluster(const cluster_source& source, const settings& s, rank_list& ranks) {
  refuse_unknown_keys(source.object, cluster_keys, source.label);
  std::string name = cluster_name_of(source);
  refuse_shared_name(s.clusters, name, source.path);
  std::vector<std::string> models = cluster_models_of(source);
  add_cluster_backends(source, name, ranks);
  std::string policy = cluster_policy_of(source, s.policy);
  return {.name = std::move(name), .models = std::move(models), .policy = std::move(policy)};
}

// The file's "clusters": every cluster with its models and policy, their backends flattened in cluster
// order (ranks are numbered globally), and the default cluster (the one marked, else the first).
void read_clusters(settings& s, const json& clusters, const std::string& path) {
  const std::string key = "key 'clusters' in config file '" + path + "'";
  if (!clusters.is_array()) {
    throw config_error(key + " must be an array of cluster objects, not " + std::string(clusters.type_name()));
  }
  if (clusters.empty()) throw config_error(key + " is empty; define at least one cluster (or remove the key)");
  rank_list ranks;
  std::optional<std::size_t> default_index;
  for (std::size_t i = 0; i < clusters.size(); ++i) {
    const cluster_source source = cluster_at(clusters, i, path);
    s.clusters.push_back(read_cluster(source, s, ranks));
    if (!marked_default(source)) continue;
    if (default_index) {
      throw config_error("clusters '" + s.clusters[*default_index].name + "' and '" + s.clusters[i].name +
                         "' in config file '" + path + "' are both \"default\": true; mark one");
    }
    default_index = i;
  }
  refuse_shared_models(s.clusters, path);
  s.backends = std::move(ranks).take();
  s.default_cluster = default_index.value_or(0);
}

// The backends come whole from the highest-precedence source that has any, never merged: --backend, then
// DPLB_BACKENDS, then the file's "clusters" or "backends". A flat list, from whichever source, is one
// implicit cluster that serves every model with the top-level policy.
void resolve_backends(settings& s, const command_line_values& cli, const environment& env, const json& file,
                      const std::string& path) {
  if (auto v = pick(backend_option(), cli, env, file, path)) {
    apply(backend_option(), *v, s);
  } else if (file.is_object() && file.contains(clusters_key)) {
    read_clusters(s, file.at(clusters_key), path);
    return;
  }
  if (s.backends.empty()) {
    throw config_error("no backend given: pass --backend http://HOST:PORT (repeatable) or set DPLB_BACKENDS");
  }
  s.clusters = {cluster_spec{.name = implicit_cluster_name, .models = {}, .policy = s.policy}};
  s.default_cluster = 0;
}

std::string_view trim_whitespace(std::string_view s) {
  constexpr std::string_view space = " \t\r\n\v\f";
  const auto first = s.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

// The admin token comes from --admin-token-file or DPLB_ADMIN_TOKEN, never both (which one was meant
// would be a guess). An admin listener without a token is refused: the API changes routing, and a
// production admin API must never be open.
void resolve_admin_token(settings& s, const environment& env) {
  const auto variable = env.find(admin_token_variable);
  const bool from_env = variable != env.end() && !variable->second.empty();
  if (s.admin_token_file && from_env) {
    throw config_error(std::string("the admin token is given twice, by --admin-token-file '") + *s.admin_token_file +
                       "' and by " + admin_token_variable + "; give one");
  }
  if (s.admin_token_file) {
    s.admin_token = std::string(trim_whitespace(read_file(*s.admin_token_file, "admin token file")));
    if (s.admin_token.empty()) {
      throw config_error("admin token file '" + *s.admin_token_file + "' is empty; put the token in it");
    }
  } else if (from_env) {
    s.admin_token = std::string(trim_whitespace(variable->second));
    if (s.admin_token.empty()) throw config_error(std::string(admin_token_variable) + " holds only whitespace; set a token");
  }
  if (s.admin_listen && s.admin_token.empty()) {
    throw config_error(std::string("--admin-listen needs a token, and the admin API is never served without one: "
                                   "name a file holding it with --admin-token-file (or DPLB_ADMIN_TOKEN_FILE) "
                                   "or set ") + admin_token_variable);
  }
}

}  // namespace

environment process_environment() {
  environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const auto eq = text.find('=');
    if (!text.starts_with("DPLB_") || eq == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

std::string help_text() {
  std::ostringstream out;
  out << "Usage: dplb --listen HOST:PORT --backend URL [--backend URL ...] --policy "
      << join(policy_names, "|", "|") << "\n"
      << "            [--threads N] [--config FILE] [--log-level LEVEL] [more options below]\n\n"
      << "dplb " << DPLB_VERSION
      << ": an HTTP/1.1 load balancer in front of vLLM engine servers, one per data-parallel rank.\n\n"
      << "Every option can also be set by its environment variable or by its key in the JSON config file.\n"
      << "Precedence, per option: command line > environment > config file > default. The backend list is\n"
      << "taken whole from the highest-precedence source that has one (sources are never merged), the config\n"
      << "file's \"clusters\" included.\n"
      << "The admin API's token is the one setting without a flag or key: DPLB_ADMIN_TOKEN (environment only),\n"
      << "unless --admin-token-file names a file that holds it.\n"
      << "Signals: SIGTERM or SIGINT drains and exits (--drain-timeout-ms); SIGHUP reads the configuration\n"
      << "again and applies its backends (added, removed, reweighted) without a restart; nothing else reloads.\n\n"
      << visible_options();
  // program_options pads wrapped lines with spaces; trailing blanks are noise in a terminal or a diff.
  std::string text = out.str();
  std::string tidy;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    line.erase(line.find_last_not_of(' ') + 1);
    tidy += line + "\n";
  }
  return tidy;
}

namespace {

// --check-config's answer: what dplb would serve, in a few lines.
std::string configuration_summary(const settings& s) {
  const auto count = [](std::size_t n, const char* noun) {
    return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
  };
  std::size_t ranks = 0;
  for (const auto& b : s.backends) ranks += b.dp;
  std::string out = "dplb: configuration OK\n";
  out += "  listen " + s.listen.host + ":" + std::to_string(s.listen.port) + "\n";
  for (std::size_t c = 0; c < s.clusters.size(); ++c) {
    const auto& cluster = s.clusters[c];
    std::size_t cluster_ranks = 0, cluster_backends = 0;
    for (const auto& b : s.backends) {
      if (b.cluster != c) continue;
      ++cluster_backends;
      cluster_ranks += b.dp;
    }
    out += "  model group " + cluster.name + ": " + count(cluster_backends, "backend") + ", " +
           count(cluster_ranks, "rank") + ", policy " + cluster.policy + "\n";
  }
  out += "  " + count(s.backends.size(), "backend") + ", " + count(ranks, "rank") + " in all\n";
  if (s.admin_listen) out += "  admin API on " + s.admin_listen->host + ":" + std::to_string(s.admin_listen->port) + "\n";
  return out;
}

}  // namespace

parse_result parse_command_line(int argc, const char* const* argv, const environment& env) {
  const command_line_values cli = read_command_line(argc, argv);
  // --help and --version answer even when the rest of the configuration is incomplete or wrong.
  if (cli.contains("help")) return {std::nullopt, help_text()};
  if (cli.contains("version")) return {std::nullopt, std::string("dplb ") + DPLB_VERSION + "\n"};

  settings s;
  json file;
  const option_spec& config_option = find_option("config");
  if (auto where = pick(config_option, cli, env, file, {})) {
    apply(config_option, *where, s);
    file = read_config_file(*s.config_file);
  }
  const std::string file_path = s.config_file.value_or("");
  for (const auto& o : option_table) {
    if (o.kind == value_kind::flag || &o == &config_option || &o == &backend_option()) continue;
    if (auto v = pick(o, cli, env, file, file_path)) apply(o, *v, s);
  }
  // After the loop: a cluster without a policy of its own takes the top-level one.
  resolve_backends(s, cli, env, file, file_path);
  resolve_admin_token(s, env);
  if (cli.contains("check-config")) return {std::nullopt, configuration_summary(s)};
  return {std::move(s), {}};
}

}  // namespace dplb::config
