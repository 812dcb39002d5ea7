#pragma once
// Which tenant a request belongs to. A known API key decides (`Authorization: Bearer KEY`); without one, a
// header naming a configured tenant that holds no key; otherwise the tenant "default", which always exists,
// at index 0. A tenant with keys is reached by its keys only: a header is trusted as sent, and naming a keyed
// tenant would let anyone spend that tenant's limits (and be served as it).
//
// Keys are kept as their SHA-256 digests only: a plain key is digested at construction and not kept, and a
// presented key is digested before the lookup. So the directory never holds a key a dump of its memory or a
// log of its contents could reveal, and comparing digests (even with an early-exit ==) tells a guesser
// nothing about a key.
//
// Immutable once built, so it may be shared between threads without a lock.

#include <boost/unordered/unordered_flat_map.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/support/sha256.hpp"
#include "dplb/tenants/tenant_spec.hpp"

namespace dplb::tenants {

class tenant_directory {
 public:
  static constexpr std::size_t default_tenant = 0;
  static constexpr std::string_view default_name = "default";

  // What the directory keeps of a tenant: its spec without its keys.
  struct tenant {
    std::string name = {};
    std::uint32_t weight = 1;
    std::optional<double> requests_per_second = std::nullopt;
    std::optional<std::uint64_t> burst = std::nullopt;
    std::optional<std::size_t> max_queued = std::nullopt;
    std::optional<double> tokens_per_minute = std::nullopt;
    std::optional<std::chrono::milliseconds> max_queue_wait = std::nullopt;
    std::optional<std::int64_t> min_priority = std::nullopt;
    bool holds_keys = false;  // api_keys or api_key_sha256 configured: no header selects it
  };

  // The default tenant, then `specs` in their order (one named "default" configures index 0 instead).
  // Throws std::invalid_argument, saying what to fix, for a name that is not 1 to 64 of A-Z a-z 0-9 . _ -,
  // a name given twice, a weight of 0, a requests_per_second or tokens_per_minute that is not a finite
  // number above 0, a burst of 0, a max_queue_wait under 1 ms, a digest that is not 64 lowercase hex digits,
  // a plain key no header could carry (empty, or beginning or ending with a blank), or a key listed twice, in
  // one tenant or two.
  // The messages name keys by their place in the spec, never by their text.
  explicit tenant_directory(std::span<const tenant_spec> specs);

  // The tenant of a request whose Authorization and tenant header have these values (empty: absent). The
  // header selects only a tenant without keys.
  std::size_t tenant_of(std::string_view authorization, std::string_view tenant_header) const;
  // Whether `authorization` carries a configured key.
  bool has_known_key(std::string_view authorization) const;
  // The tenant whose configured key `authorization` carries, if it carries one.
  std::optional<std::size_t> tenant_of_key(std::string_view authorization) const;
  // The tenant of that name, if configured (names are case-sensitive).
  std::optional<std::size_t> tenant_named(std::string_view name) const;
  // The tenant a tenant header naming `name` selects: a configured tenant that holds no key.
  std::optional<std::size_t> tenant_by_header(std::string_view name) const;

  std::span<const tenant> tenants() const { return tenants_; }

 private:
  using digest = support::sha256_digest;
  // A SHA-256 digest is uniformly spread already: its first bytes make a good hash.
  struct digest_hash {
    std::size_t operator()(const digest& d) const noexcept;
  };
  // Looks a string_view up without making a std::string of it.
  struct name_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view name) const noexcept;
  };

  std::vector<tenant> tenants_;
  boost::unordered_flat_map<std::string, std::size_t, name_hash, std::equal_to<>> by_name_;
  boost::unordered_flat_map<digest, std::size_t, digest_hash> by_key_;
};

}  // namespace dplb::tenants
