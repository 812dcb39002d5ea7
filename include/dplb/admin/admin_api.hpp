#pragma once
// The admin API's requests and answers, without sockets: each handler is a function of the request and the
// shared state, so that the whole API is unit-tested without a listener (admin_listener.hpp serves it).
//
// Every request must carry `Authorization: Bearer <token>`; then a small router maps path and method to a
// handler (a table of routes).
//
// Threading contract: handle() runs on the backend registry's thread (the main thread's loop); the
// balancer and the metrics it changes are thread-safe, and the API keeps no state of its own.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dplb::balancer {
class balancer;
}
namespace dplb::metrics {
class proxy_metrics;
}
namespace dplb::upstream {
class topology;
class backend_registry;
}

namespace dplb::admin {

struct request {
  std::string_view method;  // "GET", "POST", ...
  std::string_view target;  // path, maybe with a query (ignored)
  std::string_view authorization;  // the Authorization header's value, "" when absent
  std::string_view body;
};

// Always JSON (Content-Type: application/json).
struct response {
  unsigned status = 200;
  std::string body;
  std::string allow;               // 405: the methods the path answers, for the Allow header
  bool bearer_challenge = false;   // 401: send WWW-Authenticate: Bearer
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
  admin_api(const upstream::topology& topology, upstream::backend_registry& registry, balancer::balancer& balancer,
            metrics::proxy_metrics& metrics, std::string token, std::size_t default_cluster = 0);

  response handle(const request& req) const;

 private:
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

  // The rank named by a path segment, or nullopt when there is no such rank.
  std::optional<std::size_t> rank_of(std::string_view segment) const;
  void set_draining(std::size_t rank, bool on) const;

  static const std::vector<route>& routes();

  const upstream::topology& topology_;
  upstream::backend_registry& registry_;
  balancer::balancer& balancer_;
  metrics::proxy_metrics& metrics_;
  std::string token_;
  std::size_t default_cluster_;
};

// Whether `given` equals `token`, in a time that depends only on given's length (never on where the first
// difference is), so that response timing does not leak the token a byte at a time.
bool same_token(std::string_view given, std::string_view token) noexcept;

}  // namespace dplb::admin
