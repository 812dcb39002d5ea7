#pragma once
// Where the shared ledger lives: `--shared-state redis://[USER:PASSWORD@]HOST:PORT[/DB]`. The password is
// kept, never shown: no error text says it (nor the URL it came in).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dplb::ledger {

struct redis_endpoint {
  std::string host;
  std::uint16_t port = 6379;
  std::string user;      // empty: AUTH with the password alone (or no AUTH without one)
  std::string password;  // empty: no AUTH
  unsigned db = 0;       // SELECTed when not 0
};

// Thrown with a one-line message naming --shared-state, never the password.
class redis_url_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Parses the URL; `password`, when not empty (from --shared-state-password-file), overrides the URL's.
redis_endpoint parse_redis_url(std::string_view url, std::string_view password = {});

// The URL as it may be shown: a password in its user information replaced by `***` (any URL-like text).
std::string redacted_url(std::string_view url);

// Where the endpoint is, as logs show it: redis://[USER@]HOST:PORT[/DB], never the password.
std::string shown_endpoint(const redis_endpoint& endpoint);

}  // namespace dplb::ledger
