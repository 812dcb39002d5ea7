#include "dplb/tenants/tenant_directory.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

namespace dplb::tenants {

namespace {

using digest = support::sha256_digest;

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                         c == '_' || c == '-';
    if (!allowed) return false;
  }
  return true;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// 64 lowercase hex digits: one spelling per digest, so that a key listed twice is always seen as such.
std::optional<digest> digest_of_hex(std::string_view hex) {
  digest out{};
  if (hex.size() != 2 * out.size()) return std::nullopt;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int high = hex_digit(hex[2 * i]);
    const int low = hex_digit(hex[2 * i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    out[i] = static_cast<unsigned char>(high << 4 | low);
  }
  return out;
}

bool is_blank(char c) { return c == ' ' || c == '\t'; }

// What `Bearer KEY` carries, if that is what `authorization` is: the scheme in any case (RFC 9110 11.1), one
// space or more, the key up to trailing blanks.
std::optional<std::string_view> bearer_key(std::string_view authorization) {
  constexpr std::string_view scheme = "bearer";
  if (authorization.size() <= scheme.size() || authorization[scheme.size()] != ' ') return std::nullopt;
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != scheme[i]) return std::nullopt;
  }
  authorization.remove_prefix(scheme.size());
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  while (!authorization.empty() && is_blank(authorization.back())) authorization.remove_suffix(1);
  if (authorization.empty()) return std::nullopt;
  return authorization;
}

// A rate is a finite number above 0: 0 would refuse every request for good, and NaN or infinity would make
// the token bucket's arithmetic meaningless.
bool valid_rate(const std::optional<double>& rate) { return !rate || (std::isfinite(*rate) && *rate > 0); }

// The limits a spec sets, each checked on its own (max_queued may be 0: the tenant's requests never wait).
void refuse_bad_limits(const tenant_spec& spec) {
  if (!valid_rate(spec.requests_per_second)) {
    throw std::invalid_argument(fmt::format(
        "tenant '{}': requests_per_second {}; a rate is a finite number above 0 (requests a second)", spec.name,
        *spec.requests_per_second));
  }
  if (spec.burst && *spec.burst == 0) {
    throw std::invalid_argument(fmt::format(
        "tenant '{}': burst 0; a burst is at least 1 (the requests let through at once)", spec.name));
  }
  if (!valid_rate(spec.tokens_per_minute)) {
    throw std::invalid_argument(fmt::format(
        "tenant '{}': tokens_per_minute {}; a rate is a finite number above 0 (tokens a minute)", spec.name,
        *spec.tokens_per_minute));
  }
  if (spec.max_queue_wait && *spec.max_queue_wait < std::chrono::milliseconds(1)) {
    throw std::invalid_argument(fmt::format(
        "tenant '{}': max_queue_wait {} ms; a wait is at least 1 ms (unset, --max-queue-wait-ms applies)",
        spec.name, spec.max_queue_wait->count()));
  }
}

// Where a key was listed, for the message about a duplicate.
struct key_origin {
  std::size_t tenant;
  std::string place;  // "api_keys #2", never the key
};

}  // namespace

std::size_t tenant_directory::digest_hash::operator()(const digest& d) const noexcept {
  std::size_t h;
  std::memcpy(&h, d.data(), sizeof h);
  return h;
}

std::size_t tenant_directory::name_hash::operator()(std::string_view name) const noexcept {
  return std::hash<std::string_view>{}(name);
}

tenant_directory::tenant_directory(std::span<const tenant_spec> specs) {
  tenants_.push_back({.name = std::string(default_name)});
  by_name_.emplace(default_name, default_tenant);
  bool default_configured = false;
  std::unordered_map<digest, key_origin, digest_hash> origins;

  for (std::size_t place = 0; place < specs.size(); ++place) {
    const tenant_spec& spec = specs[place];
    if (!valid_name(spec.name)) {
      // Not quoted: what was typed there may be anything, a key pasted in the wrong field included.
      throw std::invalid_argument(fmt::format(
          "tenant #{}'s name is not 1 to 64 of A-Z a-z 0-9 . _ - (it becomes a metric label)", place + 1));
    }
    const bool is_default = spec.name == default_name;
    if (is_default ? default_configured : by_name_.contains(spec.name)) {
      throw std::invalid_argument(
          fmt::format("tenant '{}' is configured twice: give each tenant one entry", spec.name));
    }
    if (spec.weight == 0) {
      throw std::invalid_argument(fmt::format(
          "tenant '{}': weight 0; a weight is at least 1 (the tenant's share against the others')", spec.name));
    }
    refuse_bad_limits(spec);
    const std::size_t index = is_default ? default_tenant : tenants_.size();
    const tenant kept{.name = spec.name,
                      .weight = spec.weight,
                      .requests_per_second = spec.requests_per_second,
                      .burst = spec.burst,
                      .max_queued = spec.max_queued,
                      .tokens_per_minute = spec.tokens_per_minute,
                      .max_queue_wait = spec.max_queue_wait,
                      .min_priority = spec.min_priority,
                      .holds_keys = !spec.api_keys.empty() || !spec.api_key_sha256.empty()};
    if (is_default) {
      tenants_[default_tenant] = kept;
      default_configured = true;
    } else {
      tenants_.push_back(kept);
      by_name_.emplace(spec.name, index);
    }

    const auto add_key = [&](const digest& key, std::string place) {
      const auto [at, added] = origins.try_emplace(key, key_origin{index, place});
      if (added) return;
      const key_origin& first = at->second;
      if (first.tenant == index) {
        throw std::invalid_argument(fmt::format("tenant '{}' lists one key twice ({} and {}): list each key once",
                                                spec.name, first.place, place));
      }
      throw std::invalid_argument(fmt::format(
          "tenants '{}' and '{}' share a key ({} of the one, {} of the other): a key belongs to one tenant only",
          tenants_[first.tenant].name, spec.name, first.place, place));
    };
    for (std::size_t i = 0; i < spec.api_keys.size(); ++i) {
      const std::string_view key = spec.api_keys[i];
      if (key.empty() || is_blank(key.front()) || is_blank(key.back())) {
        throw std::invalid_argument(fmt::format(
            "tenant '{}': api_keys #{} is empty or begins or ends with a blank, so no Authorization header "
            "could carry it",
            spec.name, i + 1));
      }
      add_key(support::sha256(key), fmt::format("api_keys #{}", i + 1));
    }
    for (std::size_t i = 0; i < spec.api_key_sha256.size(); ++i) {
      // Not quoted in the message: what was meant as a digest may be a key pasted in the wrong field.
      const auto key = digest_of_hex(spec.api_key_sha256[i]);
      if (!key) {
        throw std::invalid_argument(fmt::format(
            "tenant '{}': api_key_sha256 #{} is not 64 lowercase hex digits (a key's SHA-256, as sha256sum "
            "prints it)",
            spec.name, i + 1));
      }
      add_key(*key, fmt::format("api_key_sha256 #{}", i + 1));
    }
  }
  for (const auto& [key, origin] : origins) by_key_.emplace(key, origin.tenant);
}

std::optional<std::size_t> tenant_directory::tenant_of_key(std::string_view authorization) const {
  if (by_key_.empty()) return std::nullopt;  // no keys configured: no digest to compute
  const auto key = bearer_key(authorization);
  if (!key) return std::nullopt;
  const auto found = by_key_.find(support::sha256(*key));
  if (found == by_key_.end()) return std::nullopt;
  return found->second;
}

std::size_t tenant_directory::tenant_of(std::string_view authorization, std::string_view tenant_header) const {
  if (const auto by_key = tenant_of_key(authorization)) return *by_key;
  return tenant_by_header(tenant_header).value_or(default_tenant);
}

std::optional<std::size_t> tenant_directory::tenant_by_header(std::string_view name) const {
  const auto named = tenant_named(name);
  if (!named || tenants_[*named].holds_keys) return std::nullopt;
  return named;
}

bool tenant_directory::has_known_key(std::string_view authorization) const {
  return tenant_of_key(authorization).has_value();
}

std::optional<std::size_t> tenant_directory::tenant_named(std::string_view name) const {
  const auto found = by_name_.find(name);
  if (found == by_name_.end()) return std::nullopt;
  return found->second;
}

}  // namespace dplb::tenants
