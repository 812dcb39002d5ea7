#include "dplb/admin/admin_api.hpp"

#include "dplb/admin/status_page.hpp"
#include "dplb/balancer/replica_ledger.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>

#include "dplb/balancer/policy.hpp"
#include "dplb/config/settings.hpp"
#include "dplb/http/error_response.hpp"
#include "dplb/tenants/tenant_book.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/backend_registry.hpp"

namespace dplb::admin {

namespace {

using json = nlohmann::ordered_json;

response json_response(unsigned status, const json& body) { return response{.status = status, .body = body.dump()}; }

response error(unsigned status, std::string_view message) {
  return response{.status = status, .body = http::error_body(status, message)};
}

// A file of the status page, with the headers that keep it to itself: its CSP (no inline code, nothing
// from elsewhere), never framed, no Referer sent from it.
response page_file(const static_asset& asset) {
  response r{.status = 200, .body = std::string(asset.body)};
  r.content_type = asset.content_type;
  r.headers = {{"Content-Security-Policy", std::string(status_page_csp)},
               {"X-Frame-Options", "DENY"},
               {"Referrer-Policy", "no-referrer"}};
  return r;
}

// The rank_flag bits by name, in bit order.
constexpr std::pair<balancer::rank_flag, std::string_view> flag_names[] = {
    {balancer::rank_flag::unhealthy, "unhealthy"},
    {balancer::rank_flag::ejected, "ejected"},
    {balancer::rank_flag::draining, "draining"},
    {balancer::rank_flag::removed, "removed"},
};

json rank_json(const upstream::rank_status& r) {
  json names = json::array();
  for (const auto& [bit, name] : flag_names) {
    if ((r.flags & bit) != 0) names.push_back(name);
  }
  json kv_events = nullptr;
  if (r.kv_events) {
    kv_events = json{{"blocks", r.kv_events->blocks},
                     {"events", r.kv_events->events},
                     {"errors", r.kv_events->errors},
                     {"lag_seconds", r.kv_events->lag_seconds ? json(*r.kv_events->lag_seconds) : json(nullptr)}};
  }
  json engine = nullptr;
  if (r.engine) {
    engine = json{{"running", r.engine->load.running},
                  {"waiting", r.engine->load.waiting},
                  {"kv_cache_usage", r.engine->load.kv_cache_usage},
                  {"age_seconds", std::chrono::duration<double>(r.engine->age).count()}};
  }
  return json{{"rank", r.rank},
              {"url", r.url},
              {"index_in_url", r.index_in_url},
              {"dp", r.dp},
              {"backend_state", upstream::name_of(r.backend)},
              {"cluster", r.cluster},
              {"role", config::role_name(r.role)},
              {"policy", r.policy},
              {"weight", r.weight},
              {"flags", std::move(names)},
              {"usable", r.flags == 0},
              {"inflight", r.inflight},
              {"requests_total", r.requests},
              {"responses_total", r.responses},
              {"errors_total", r.server_errors},
              {"upstream_errors_total", r.upstream_errors},
              {"tokens_inflight", r.tokens_inflight},
              {"engine", std::move(engine)},
              {"kv_events", std::move(kv_events)}};
}

json backend_json(const upstream::backend_status& b) {
  json ranks = json::array();
  for (const auto& r : b.ranks) ranks.push_back(rank_json(r));
  return json{{"url", b.url},
              {"dp", b.dp},
              {"cluster", b.cluster},
              {"state", upstream::name_of(b.state)},
              {"ranks", std::move(ranks)}};
}

json optional_json(const auto& value) { return value ? json(*value) : json(nullptr); }

// A tenant as the admin API shows it: its limits as configured (a burst left to its default shown as it
// applies) and its counts now. Its keys are not shown, not even as digests.
json tenant_json(const tenants::tenant_state::snapshot& t) {
  const auto& l = t.limits;
  std::optional<std::uint64_t> burst = l.burst;
  if (!burst && l.requests_per_second) burst = static_cast<std::uint64_t>(std::max(1.0, std::ceil(*l.requests_per_second)));
  std::optional<std::int64_t> max_queue_wait_ms;
  if (l.max_queue_wait) max_queue_wait_ms = l.max_queue_wait->count();
  json by_status = json::object();
  std::uint64_t total = 0;
  for (const auto& [status, count] : t.requests_by_status) {
    by_status[std::to_string(status)] = count;
    total += count;
  }
  return json{{"name", t.name},
              {"weight", l.weight},
              {"limits", json{{"requests_per_second", optional_json(l.requests_per_second)},
                              {"burst", optional_json(burst)},
                              {"max_queued", optional_json(l.max_queued)},
                              {"tokens_per_minute", optional_json(l.tokens_per_minute)},
                              {"max_queue_wait_ms", optional_json(max_queue_wait_ms)},
                              {"min_priority", optional_json(l.min_priority)}}},
              {"in_flight", t.in_flight},
              {"queued", t.queued},
              {"requests_per_second", t.requests_per_second},
              {"requests_total", total},
              {"requests_by_status", std::move(by_status)},
              {"prompt_tokens_total", t.prompt_tokens},
              {"completion_tokens_total", t.completion_tokens}};
}

// The body as a JSON object, or the 400 that says why it is not one.
std::optional<json> object_body(std::string_view body, response& refusal) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    refusal = error(400, "the body must be a JSON object");
    return std::nullopt;
  }
  return parsed;
}

// Splits "/a/b/c" into its segments; the empty path and "/" have none.
std::vector<std::string_view> segments_of(std::string_view path) {
  std::vector<std::string_view> out;
  while (!path.empty()) {
    if (path.front() == '/') path.remove_prefix(1);
    const auto slash = std::min(path.find('/'), path.size());
    out.push_back(path.substr(0, slash));
    path.remove_prefix(slash);
  }
  return out;
}

// Whether `path` fits `pattern`; the {placeholder} segments are appended to `params`.
bool match(std::string_view pattern, std::string_view path, std::vector<std::string_view>& params) {
  const auto want = segments_of(pattern);
  const auto have = segments_of(path);
  if (want.size() != have.size()) return false;
  std::vector<std::string_view> found;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i].starts_with('{')) {
      if (have[i].empty()) return false;
      found.push_back(have[i]);
    } else if (want[i] != have[i]) {
      return false;
    }
  }
  params = std::move(found);
  return true;
}

// What follows `scheme` ("bearer ", "basic ": lower case, with its space) in an Authorization value, without
// trailing blanks. The scheme is case-insensitive (RFC 9110 11.1), the credentials are not.
std::optional<std::string_view> credentials_of(std::string_view authorization, std::string_view scheme) {
  if (authorization.size() <= scheme.size()) return std::nullopt;
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != scheme[i]) return std::nullopt;
  }
  authorization.remove_prefix(scheme.size());
  while (!authorization.empty() && (authorization.back() == ' ' || authorization.back() == '\t')) {
    authorization.remove_suffix(1);
  }
  return authorization;
}

// "Bearer <token>".
std::optional<std::string_view> bearer_token(std::string_view authorization) {
  return credentials_of(authorization, "bearer ");
}

// Standard base64 (RFC 4648 4), padding optional; nullopt on any other character or a length no encoding
// has.
std::optional<std::string> base64_decoded(std::string_view text) {
  if (text.ends_with("==")) {
    text.remove_suffix(2);
  } else if (text.ends_with('=')) {
    text.remove_suffix(1);
  }
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() * 3 / 4);
  std::uint32_t bits = 0;
  int held = 0;
  for (const char c : text) {
    int value = -1;
    if (c >= 'A' && c <= 'Z') value = c - 'A';
    else if (c >= 'a' && c <= 'z') value = c - 'a' + 26;
    else if (c >= '0' && c <= '9') value = c - '0' + 52;
    else if (c == '+') value = 62;
    else if (c == '/') value = 63;
    if (value < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<std::uint32_t>(value);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<char>((bits >> held) & 0xFF));
    }
  }
  return out;
}

// A method that changes nothing (RFC 9110 9.2.1).
bool safe_method(std::string_view method) { return method == "GET" || method == "HEAD"; }

// Whether a browser sent the request from a page of another origin: it then names that origin (a page's
// form or fetch always does, for anything but GET and HEAD). dplb serves plain HTTP, so its own origin is
// http://<Host>. Tools (curl) send no Origin.
bool from_another_origin(const request& req) {
  return !req.origin.empty() && (req.host.empty() || req.origin != "http://" + std::string(req.host));
}

}  // namespace

std::optional<std::string> basic_password(std::string_view authorization) {
  const auto encoded = credentials_of(authorization, "basic ");
  if (!encoded) return std::nullopt;
  auto credentials = base64_decoded(*encoded);
  // user-id ":" password; the user-id has no colon, the password may have some.
  const auto colon = credentials ? credentials->find(':') : std::string::npos;
  if (colon == std::string::npos) return std::nullopt;
  return credentials->substr(colon + 1);
}

admin_api::admin_api(upstream::backend_registry& registry, std::string_view token, std::size_t default_cluster)
    : registry_(registry), token_(token), default_cluster_(default_cluster) {}

const std::vector<admin_api::route>& admin_api::routes() {
  static const std::vector<route> table{
      {"GET", "/ranks", &admin_api::list_ranks},
      {"POST", "/ranks/{rank}/drain", &admin_api::drain_rank},
      {"POST", "/ranks/{rank}/undrain", &admin_api::undrain_rank},
      {"PUT", "/ranks/{rank}/weight", &admin_api::set_rank_weight},
      {"GET", "/backends", &admin_api::list_backends},
      {"POST", "/backends", &admin_api::add_backend},
      {"POST", "/backends/remove", &admin_api::remove_backend},
      {"POST", "/backends/drain", &admin_api::drain_backend},
      {"POST", "/backends/undrain", &admin_api::undrain_backend},
      {"GET", "/tenants", &admin_api::list_tenants},
      {"POST", "/tenants/reload", &admin_api::reload_tenants},
  };
  return table;
}

admin_api::credential admin_api::authenticate(std::string_view authorization) const {
  if (const auto given = bearer_token(authorization)) {
    return token_.matches(*given) ? credential::bearer : credential::none;
  }
  if (const auto password = basic_password(authorization)) {
    return token_.matches(*password) ? credential::basic : credential::none;
  }
  return credential::none;
}

response admin_api::handle(const request& req) const {
  const std::string_view path = req.target.substr(0, req.target.find('?'));
  const auto* page = status_page_asset(path);
  // Authentication comes first, so that without the token not even which paths exist can be learnt (the
  // status page's paths aside: they ask a browser for Basic credentials, so that it prompts for them).
  const auto how = authenticate(req.authorization);
  if (how == credential::none) {
    response r = error(401, "the admin API needs dplb's admin token: the header 'Authorization: Bearer <token>', "
                            "or Basic credentials with the token as the password");
    if (page) r.headers.push_back({"WWW-Authenticate", R"(Basic realm="dplb admin", charset="UTF-8")"});
    r.headers.push_back({"WWW-Authenticate", "Bearer"});
    return r;
  }
  // A browser holding Basic credentials sends them with any request to this listener, a forged one from
  // another site's page included: such a page may not change anything.
  if (how == credential::basic && !safe_method(req.method) && from_another_origin(req)) {
    return error(403, "a change with Basic credentials must come from the admin listener's own page (Origin "
                      "differs from Host); tools send 'Authorization: Bearer <token>'");
  }
  if (page) {
    if (req.method == "GET") return page_file(*page);
    response r = error(405, std::string(path) + " answers GET, not " + std::string(req.method));
    r.allow = "GET";
    return r;
  }
  std::string allow;
  for (const auto& r : routes()) {
    call c{{}, req.body};
    if (!match(r.pattern, path, c.params)) continue;
    if (r.method == req.method) return (this->*r.serve)(c);
    allow += (allow.empty() ? "" : ", ") + std::string(r.method);
  }
  if (allow.empty()) return error(404, "no admin endpoint " + std::string(path) + "; see docs/operations.md");
  response r = error(405, std::string(path) + " answers " + allow + ", not " + std::string(req.method));
  r.allow = std::move(allow);
  return r;
}

std::optional<std::size_t> admin_api::rank_of(std::string_view segment) const {
  std::size_t rank = 0;
  const auto [end, ec] = std::from_chars(segment.data(), segment.data() + segment.size(), rank);
  if (ec != std::errc{} || end != segment.data() + segment.size() || rank >= registry_.rank_count()) {
    return std::nullopt;
  }
  return rank;
}

response admin_api::list_ranks(const call&) const {
  json ranks = json::array();
  for (std::size_t r = 0; r < registry_.rank_count(); ++r) ranks.push_back(rank_json(registry_.status_of_rank(r)));
  const auto now = std::chrono::steady_clock::now();
  const auto uptime = std::chrono::duration<double>(now - started_).count();
  // With a shared ledger, its view next to this replica's own counts: each rank's requests in flight over
  // every replica ("inflight_all_replicas"), as of the ledger's last answer (refreshed every second).
  json shared = nullptr;
  if (ledger_ != nullptr) {
    const auto view = ledger_->last_view();
    shared = json{{"up", ledger_->up()},
                  {"replica", ledger_->replica_name()},
                  {"replicas", view ? json(view->replicas) : json(nullptr)},
                  {"view_age_seconds",
                   view ? json(std::floor(std::chrono::duration<double>(now - view->taken).count() * 10) / 10)
                        : json(nullptr)}};
    for (auto& rank : ranks) {
      json all = nullptr;
      if (view) {
        const auto held = view->inflight.find(rank["rank"].get<std::size_t>());
        all = held == view->inflight.end() ? 0u : held->second;
      }
      rank["inflight_all_replicas"] = std::move(all);
    }
  }
  return json_response(200, json{{"version", DPLB_VERSION},
                                 {"uptime_seconds", std::floor(uptime * 10) / 10},
                                 {"policy", registry_.policy_name(default_cluster_)},
                                 {"inflight_skew", registry_.inflight_skew()},
                                 {"shared_state", std::move(shared)},
                                 {"ranks", std::move(ranks)}});
}

response admin_api::set_rank_draining(const call& c, bool on) const {
  const auto rank = rank_of(c.params.at(0));
  if (!rank) return error(404, "no rank " + std::string(c.params.at(0)) + "; GET /ranks lists them");
  registry_.set_draining(*rank, on);
  return json_response(200, rank_json(registry_.status_of_rank(*rank)));
}

namespace {

// The backend an object names in {"url": ...}, normalised as --backend normalises it (so that
// http://Engine:8000/ finds http://engine:8000). Options after '#' (dp, weight) describe a backend to add;
// to name an existing one they are refused, since they do not identify it.
std::optional<config::backend_spec> backend_in(const json& body, bool options_allowed, response& refusal) {
  const auto url = body.find("url");
  if (url == body.end() || !url->is_string()) {
    refusal = error(400, options_allowed
                             ? R"(expected {"url": "http://HOST:PORT#dp=N&weight=W"}, as --backend takes it)"
                             : R"(expected {"url": "http://HOST:PORT"}, the backend as --backend names it)");
    return std::nullopt;
  }
  const auto text = url->get<std::string>();
  if (!options_allowed && text.find('#') != std::string::npos) {
    refusal = error(400, "give the backend's URL without its #options");
    return std::nullopt;
  }
  config::backend_spec spec;
  if (auto why = config::parse_backend(text, spec); !why.empty()) {
    refusal = error(400, "invalid url '" + text + "': " + why);
    return std::nullopt;
  }
  return spec;
}

// The same, from a request body that must be a JSON object.
std::optional<config::backend_spec> backend_in_body(std::string_view body_text, bool options_allowed,
                                                    response& refusal) {
  const auto body = object_body(body_text, refusal);
  if (!body) return std::nullopt;
  return backend_in(*body, options_allowed, refusal);
}

}  // namespace

response admin_api::set_backend_draining(const call& c, bool on) const {
  response refusal;
  const auto spec = backend_in_body(c.body, false, refusal);
  if (!spec) return refusal;
  const auto* backend = registry_.active(spec->url);
  if (!backend) return error(404, "no active backend " + spec->url + "; GET /backends lists them");
  for (std::size_t r = backend->first_rank; r < backend->first_rank + backend->dp; ++r) registry_.set_draining(r, on);
  return json_response(200, backend_json(registry_.status_of(*backend)));
}

response admin_api::list_backends(const call&) const {
  json backends = json::array();
  for (const auto& b : registry_.listed_backends()) backends.push_back(backend_json(b));
  return json_response(200, json{{"backends", std::move(backends)}});
}

response admin_api::add_backend(const call& c) const {
  response refusal;
  const auto body = object_body(c.body, refusal);
  if (!body) return refusal;
  auto spec = backend_in(*body, true, refusal);
  if (!spec) return refusal;
  // The cluster it joins: by name, else the default one; of a disaggregated cluster, the pool "role" names
  // (prefill or decode; decode when it names none).
  auto role = config::rank_role::both;
  if (const auto given = body->find("role"); given != body->end()) {
    const auto text = given->is_string() ? given->get<std::string>() : std::string();
    if (text != "prefill" && text != "decode" && text != "both") {
      return error(400, "\"role\" must be \"prefill\" or \"decode\" (a disaggregated cluster's pools), or \"both\"");
    }
    role = text == "prefill" ? config::rank_role::prefill : text == "decode" ? config::rank_role::decode : role;
  }
  const auto cluster_name = registry_.cluster_name(default_cluster_);
  const auto cluster = body->find("cluster");
  if (cluster != body->end() && !cluster->is_string()) {
    return error(400, "\"cluster\" must name a cluster of the configuration; GET /backends shows them");
  }
  const auto named = registry_.cluster_named(cluster != body->end() ? cluster->get<std::string>() : cluster_name, role);
  if (!named) {
    return error(400, cluster != body->end() && !registry_.cluster_named(cluster->get<std::string>())
                          ? "\"cluster\" must name a cluster of the configuration; GET /backends shows them"
                          : "that cluster has no pool with this \"role\"; GET /backends shows each rank's role");
  }
  spec->cluster = *named;
  try {
    return json_response(201, backend_json(registry_.status_of(registry_.add(*spec))));
  } catch (const upstream::backend_change_error& e) {
    return error(e.status(), e.what());
  } catch (const std::exception& e) {
    spdlog::error("admin API: adding {} failed: {}", spec->url, e.what());
    return error(500, std::string("adding the backend failed: ") + e.what());
  }
}

response admin_api::remove_backend(const call& c) const {
  response refusal;
  const auto spec = backend_in_body(c.body, false, refusal);
  if (!spec) return refusal;
  try {
    // 202: accepted, and done once the requests in flight on it finish ("state" says which).
    const auto& removed = registry_.remove(spec->url);
    return json_response(registry_.state_of(removed.index) == upstream::backend_state::removed ? 200 : 202,
                         backend_json(registry_.status_of(removed)));
  } catch (const upstream::backend_change_error& e) {
    return error(e.status(), e.what());
  } catch (const std::exception& e) {
    spdlog::error("admin API: removing {} failed: {}", spec->url, e.what());
    return error(500, std::string("removing the backend failed: ") + e.what());
  }
}

response admin_api::set_rank_weight(const call& c) const {
  const auto rank = rank_of(c.params.at(0));
  if (!rank) return error(404, "no rank " + std::string(c.params.at(0)) + "; GET /ranks lists them");
  response refusal;
  const auto body = object_body(c.body, refusal);
  if (!body) return refusal;
  const auto weight = body->find("weight");
  if (weight == body->end() || !weight->is_number_unsigned() || weight->get<std::uint64_t>() < 1 ||
      weight->get<std::uint64_t>() > config::max_backend_weight) {
    return error(400, "expected {\"weight\": W}, W a whole number from 1 to " +
                          std::to_string(config::max_backend_weight) + " (to take a rank out, drain it)");
  }
  const auto w = static_cast<std::uint32_t>(weight->get<std::uint64_t>());
  registry_.set_weight(*rank, w);
  return json_response(200, rank_json(registry_.status_of_rank(*rank)));
}

response admin_api::list_tenants(const call&) const {
  json tenants = json::array();
  if (tenants_) {
    const auto now = std::chrono::steady_clock::now();
    for (const auto& t : tenants_->tenants()) tenants.push_back(tenant_json(t->read(now)));
  }
  return json_response(200, json{{"tenants", std::move(tenants)}});
}

response admin_api::reload_tenants(const call&) const {
  if (!tenants_ || !reload_tenants_) return error(409, "this dplb has no configuration file to reload tenants from");
  if (auto failed = reload_tenants_(); !failed.empty()) {
    return error(400, "tenants not reloaded (the running ones are kept): " + failed);
  }
  return list_tenants({});
}

}  // namespace dplb::admin
