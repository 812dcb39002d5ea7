#include "dplb/ledger/redis_url.hpp"

#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <charconv>

namespace dplb::ledger {

namespace {

[[noreturn]] void fail(std::string_view why) {
  // The URL itself is never quoted: it may hold the password.
  throw redis_url_error("--shared-state: " + std::string(why) +
                        " (expected redis://[USER:PASSWORD@]HOST:PORT[/DB])");
}

template <class Number>
bool parse_number(std::string_view text, Number& out) {
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return !text.empty() && ec == std::errc{} && ptr == end;
}

}  // namespace

redis_endpoint parse_redis_url(std::string_view url, std::string_view password) {
  const auto parsed = boost::urls::parse_uri(url);
  if (!parsed) fail("not a URL");
  const boost::urls::url_view& u = *parsed;
  if (u.scheme() != "redis") fail("the scheme must be redis://");
  if (u.has_query() || u.has_fragment()) fail("a query or a fragment is not allowed");

  redis_endpoint out;
  out.host = u.host_address();
  if (out.host.empty()) fail("no host");
  if (u.has_port() && !parse_number(u.port(), out.port)) fail("the port is not a number from 1 to 65535");
  if (out.port == 0) fail("the port is not a number from 1 to 65535");
  if (u.has_userinfo()) {
    out.user = u.user();
    out.password = u.password();
  }
  if (!password.empty()) out.password = password;

  std::string_view path = u.encoded_path();
  if (!path.empty() && path != "/") {
    path.remove_prefix(path.front() == '/' ? 1 : 0);
    if (!parse_number(path, out.db)) fail("the path must be a database number");
  }
  return out;
}

std::string redacted_url(std::string_view url) {
  std::string shown(url);
  const auto scheme_end = shown.find("://");
  const auto authority = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  // The last '@': a password with an '@' of its own (not percent-encoded) must not show its tail.
  const auto at = shown.rfind('@');
  if (at == std::string::npos || at < authority) return shown;
  const auto colon = shown.find(':', authority);
  if (colon < at) shown.replace(colon + 1, at - colon - 1, "***");
  else shown.replace(authority, at - authority, "***");  // no colon: the user part may be a password
  return shown;
}

std::string shown_endpoint(const redis_endpoint& endpoint) {
  const bool v6 = endpoint.host.find(':') != std::string::npos;
  std::string shown = "redis://";
  if (!endpoint.user.empty()) shown += endpoint.user + "@";
  shown += v6 ? "[" + endpoint.host + "]" : endpoint.host;
  shown += ":" + std::to_string(endpoint.port);
  if (endpoint.db != 0) shown += "/" + std::to_string(endpoint.db);
  return shown;
}

}  // namespace dplb::ledger
