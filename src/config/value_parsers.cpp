#include "value_parsers.hpp"

#include <boost/url/ipv4_address.hpp>
#include <boost/url/ipv6_address.hpp>
#include <boost/url/parse.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

namespace dplb::config {
namespace detail {
namespace {

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

// The value of `kv-events=` or `kv-replay=`: tcp://HOST:PORT, HOST an IP literal ([IPv6] in brackets) or a
// name. Returns why it is refused, "" when good.
std::string parse_zmq_endpoint(std::string_view key, std::string_view text, zmq_endpoint& out) {
  const std::string expected = std::string(key) + " must be tcp://HOST:PORT (the engine's --kv-events-config " +
                               (key == "kv-events" ? "endpoint" : "replay_endpoint") +
                               " with its host), e.g. " + std::string(key) + "=tcp://10.0.0.5:" +
                               (key == "kv-events" ? "5557" : "5558");
  const auto parsed = boost::urls::parse_uri(text);
  if (!parsed || parsed->scheme() != "tcp" || !parsed->has_authority() || parsed->encoded_host().empty() ||
      parsed->has_userinfo() || !parsed->encoded_path().empty() || parsed->has_query() || parsed->has_fragment()) {
    return expected;
  }
  const boost::urls::url_view u = *parsed;
  switch (u.host_type()) {
    case boost::urls::host_type::ipv4:
      out.host = u.host_ipv4_address().to_string();
      break;
    case boost::urls::host_type::ipv6:
      out.host = "[" + u.host_ipv6_address().to_string() + "]";
      break;
    case boost::urls::host_type::name:
      if (!valid_host(u.encoded_host())) {
        return std::string(key) + ": '" + std::string(u.encoded_host()) + "' is not an IP address or host name "
               "(the engine binds tcp://*:PORT; dplb needs the host it runs on)";
      }
      out.host = to_lower(u.encoded_host());
      break;
    default:
      return expected;
  }
  const auto port = u.has_port() ? parse_unsigned(u.port()) : std::nullopt;
  if (!port || *port == 0 || *port > 65535) return expected;
  out.port = static_cast<std::uint16_t>(*port);
  return {};
}

// The options after '#' in a backend URL, joined by '&', each at most once: `dp=N`, `weight=W`,
// `kv-events=tcp://H:P` and `kv-replay=tcp://H:P`.
std::string parse_backend_options(std::string_view fragment, backend_spec& out) {
  static constexpr std::string_view expected =
      "expected #dp=N, #weight=W, #kv-events=tcp://HOST:PORT or #kv-replay=tcp://HOST:PORT after the URL, "
      "joined by '&'";
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
    } else if (key == "kv-events" || key == "kv-replay") {
      auto& endpoint = key == "kv-events" ? out.kv_events : out.kv_replay;
      if (endpoint) return std::string(key) + " is given twice";
      zmq_endpoint parsed;
      if (auto why = parse_zmq_endpoint(key, eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1), parsed);
          !why.empty()) {
        return why;
      }
      endpoint = std::move(parsed);
    } else {
      return "unknown option '" + std::string(item) + "'; " + std::string(expected);
    }
  }
  if (out.kv_replay && !out.kv_events) {
    return "kv-replay needs kv-events: name the engine's event publisher too, e.g. "
           "#kv-events=tcp://HOST:5557&kv-replay=tcp://HOST:5558";
  }
  // vLLM's rule: DP rank j publishes on the base port + j.
  for (const auto* endpoint : {&out.kv_events, &out.kv_replay}) {
    if (*endpoint && (*endpoint)->port + std::uint64_t{out.dp} - 1 > 65535) {
      return "the KV-event port " + std::to_string((*endpoint)->port) + " + " + std::to_string(out.dp - 1) +
             " (rank j publishes on PORT+j) is beyond 65535";
    }
  }
  return {};
}

}  // namespace

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

std::optional<bool> parse_boolean(std::string_view s) {
  const std::string lower = to_lower(s);
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
  return std::nullopt;
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

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// The canonical spelling of a choice, matched case-insensitively (DPLB_LOG_LEVEL=INFO is a natural thing to
// write); nullopt when it is none of them.
std::optional<std::string_view> canonical_choice(std::span<const std::string_view> choices, std::string_view text) {
  const std::string lower = to_lower(text);
  const auto it = std::find(choices.begin(), choices.end(), lower);
  if (it == choices.end()) return std::nullopt;
  return *it;
}

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

}  // namespace detail

using namespace detail;

std::string parse_backend(std::string_view text, backend_spec& spec) {
  std::string& out = spec.url;
  static constexpr std::string_view example = "expected a URL like http://127.0.0.1:8100";
  // The options after '#' are read apart from the URL: a kv-events endpoint may hold an IPv6 literal in
  // brackets, which RFC 3986 does not allow in a fragment.
  const std::size_t hash = text.find('#');
  // A flag beside a plain view, not an optional one: GCC 12 sees the optional's payload as maybe
  // uninitialised once this is inlined into a unity build's translation unit (-Wmaybe-uninitialized).
  const bool has_fragment = hash != std::string_view::npos;
  const std::string_view fragment = has_fragment ? text.substr(hash + 1) : std::string_view{};
  text = text.substr(0, hash);
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
  if (has_fragment) {
    if (fragment.empty()) return "an empty '#' is not supported; expected #dp=N, #weight=W or #kv-events=tcp://HOST:PORT";
    return parse_backend_options(fragment, spec);
  }
  return {};
}

}  // namespace dplb::config
