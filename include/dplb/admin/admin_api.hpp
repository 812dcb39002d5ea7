#pragma once
// The admin API's requests and answers, without sockets: each handler is a function of the request and the
// shared state, so that the whole API is unit-tested without a listener (admin_listener.hpp serves it).
//
// Every request must carry the token, as `Authorization: Bearer <token>` or, for a browser (which cannot
// send a Bearer header when it opens a page), as HTTP Basic credentials whose password is the token; then
// a small router maps path and method to a handler (a table of routes), and the status page's files
// (status_page.hpp) are served at their paths.
//
// It sees dplb through the backend registry alone: the registry's read model (rank_status, backend_status)
// is what it shows, and the registry makes every change it asks for.
//
// Threading contract: handle() runs on the backend registry's thread (the main thread's loop); what the
// registry changes is thread-safe, and the API keeps no state of its own but the token's digest, which
// SIGHUP replaces (set_token) on that same thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/admin/token_digest.hpp"

namespace dplb::upstream {
class backend_registry;
}
namespace dplb::tenants {
class tenant_book;
}
namespace dplb::balancer {
class replica_ledger;
}

namespace dplb::admin {

struct request {
  std::string_view method;  // "GET", "POST", ...
  std::string_view target;  // path, maybe with a query (ignored)
  std::string_view authorization;  // the Authorization header's value, "" when absent
  std::string_view body;
  // The Origin and Host headers ("" when absent): a browser sends Basic credentials by itself, so a
  // change made with them is refused when a page of another origin asked for it (cross-site forgery).
  std::string_view origin = {};
  std::string_view host = {};
};

struct header {
  std::string_view name;
  std::string value;
};

struct response {
  unsigned status = 200;
  std::string body = {};
  std::string allow = {};  // 405: the methods the path answers, for the Allow header
  std::string_view content_type = "application/json";  // JSON but for the status page's files
  std::vector<header> headers = {};  // more: the 401's WWW-Authenticate challenges, the page's security headers
};

// What a handler gets: the path's {placeholders} in order, and the body.
struct call {
  std::vector<std::string_view> params;
  std::string_view body;
};

class admin_api {
 public:
  // `token` must not be empty (settings refuse an admin listener without one).
  // A backend added without a "cluster" joins `default_cluster`.
  admin_api(upstream::backend_registry& registry, std::string_view token, std::size_t default_cluster = 0);

  response handle(const request& req) const;

  // Replaces the token (SIGHUP read its file again); on the same thread as handle(). Not empty.
  void set_token(std::string_view token) { token_ = token_digest(token); }

  // The tenants: GET /tenants shows each one's limits and counts (never a key), POST /tenants/reload calls
  // `reload`, which reads the configuration again and applies its tenants, and returns what kept it from
  // doing so ("" when it did). `book` must outlive this. Before serving.
  void serve_tenants(const tenants::tenant_book& book, std::function<std::string()> reload) {
    tenants_ = &book;
    reload_tenants_ = std::move(reload);
  }

  // The ledger shared with the other replicas (--shared-state): GET /ranks shows its view of every rank
  // (every replica's requests in flight) next to this replica's own. `ledger` must outlive this. Before serving.
  void show_shared_state(const balancer::replica_ledger& ledger) { ledger_ = &ledger; }

 private:
  enum class credential { none, bearer, basic };
  using handler = response (admin_api::*)(const call&) const;
  struct route {
    std::string_view method;
    std::string_view pattern;  // "/ranks/{rank}/drain": a {...} segment matches any one segment
    handler serve;
  };

  response list_ranks(const call&) const;
  response drain_rank(const call& c) const { return set_rank_draining(c, true); }
  response undrain_rank(const call& c) const { return set_rank_draining(c, false); }
  response set_rank_draining(const call& c, bool on) const;
  response drain_backend(const call& c) const { return set_backend_draining(c, true); }
  response undrain_backend(const call& c) const { return set_backend_draining(c, false); }
  response set_backend_draining(const call& c, bool on) const;
  response set_rank_weight(const call& c) const;
  response list_backends(const call&) const;
  response add_backend(const call& c) const;
  response remove_backend(const call& c) const;
  response list_tenants(const call&) const;
  response reload_tenants(const call&) const;

  // How the request proved it holds the token, if it did.
  credential authenticate(std::string_view authorization) const;

  // The rank named by a path segment, or nullopt when there is no such rank.
  std::optional<std::size_t> rank_of(std::string_view segment) const;

  static const std::vector<route>& routes();

  upstream::backend_registry& registry_;
  token_digest token_;  // the token's digest: the token itself is not kept
  std::size_t default_cluster_;
  const tenants::tenant_book* tenants_ = nullptr;
  const balancer::replica_ledger* ledger_ = nullptr;
  std::function<std::string()> reload_tenants_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();  // for uptime_seconds
};

// The password of `Authorization: Basic <base64(user:password)>` (RFC 7617; the scheme in any case), or
// nullopt when the header is not that.
std::optional<std::string> basic_password(std::string_view authorization);

}  // namespace dplb::admin
