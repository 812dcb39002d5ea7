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

}  // namespace dplb::ledger
