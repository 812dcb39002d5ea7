#pragma once
// dplb's configuration: one plain struct, filled from (highest precedence first) the command line, the
// environment (DPLB_*), a JSON config file, and the defaults written here. Parsing is pure (no I/O except
// reading the config file) so that precedence is unit-tested without starting anything.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/ledger/redis_url.hpp"
#include "dplb/tenants/tenant_spec.hpp"

namespace dplb::config {

// Thrown for any bad option, value or config file; the message is one line that says what to fix.
// main() prints it and exits with status 2.
class config_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct listen_address {
  std::string host = "0.0.0.0";  // IPv4 or IPv6 literal, or a name resolved at start-up
  std::uint16_t port = 8000;     // vLLM's default port, so clients need no change; 0 = ephemeral
};

enum class log_format { text, json };

// --fair-by: what tenants of one priority share by weight when they compete for freed slots: the number of
// requests each is served, or the tokens those requests cost (prompt + max_tokens).
enum class fair_basis { requests, tokens };

// --tokenize: where a text prompt's token ids come from for matching KV-cache events. off: nowhere (text
// is matched by the approximate index; prompts given as token ids still match the events); engine: the
// cluster's engine, with vLLM's POST /tokenize (the chat template applied, as the engine will).
enum class tokenize_mode { off, engine };

// One --backend entry: an engine server's base URL and what stands behind it. `http://h:8000#dp=4&weight=2`
// is four DP ranks behind one URL (vLLM's internal load balancing, `vllm serve --data-parallel-size 4`),
// each weighted 2. The fragment carries the options because it is the one part of a URL that never
// reaches the server and that no URL parser confuses with the authority (`host:port@rank`, read as user
// info, broke two other routers).
// A ZMQ TCP endpoint dplb connects to: an engine's KV-cache event publisher or its replay socket. vLLM
// binds one per DP rank, rank j on the base port + j, so a backend's endpoint names rank 0's port.
struct zmq_endpoint {
  std::string host;  // as written (an IP literal, [IPv6] in brackets, or a name ZMQ resolves)
  std::uint16_t port = 0;

  // "tcp://host:port" of the j-th DP rank behind the backend.
  std::string for_rank(std::uint32_t j) const { return "tcp://" + host + ":" + std::to_string(port + j); }
  bool operator==(const zmq_endpoint&) const = default;
};

// What a rank does. A co-located rank (`both`) serves whole requests; with --prefill/--decode (or a
// cluster's "prefill" and "decode" lists) dplb runs every completion in two legs: a `prefill` rank computes
// the prompt's KV cache and answers its kv_transfer_params, a `decode` rank pulls that cache and generates.
enum class rank_role : std::uint8_t { both, prefill, decode };

inline constexpr std::string_view role_name(rank_role role) noexcept {
  switch (role) {
    case rank_role::prefill: return "prefill";
    case rank_role::decode: return "decode";
    default: return "both";
  }
}

struct backend_spec {
  std::string url;           // normalised "http://host:port"
  std::uint32_t dp = 1;      // DP ranks served behind the URL; each gets X-data-parallel-rank: 0..dp-1
  std::uint32_t weight = 1;  // relative share of each of its ranks; every policy honours it
  std::size_t cluster = 0;   // index into settings.clusters
  // `#kv-events=tcp://H:P`: the engines' KV-cache event publishers (rank j on P + j); dplb indexes what
  // each rank caches from them. `#kv-replay=tcp://H:P`: their replay sockets, asked for what a sequence
  // gap lost. Both optional; kv_replay only with kv_events.
  std::optional<zmq_endpoint> kv_events = std::nullopt;
  std::optional<zmq_endpoint> kv_replay = std::nullopt;
  rank_role role = rank_role::both;  // as its cluster's: both, or decode / prefill in a disaggregated one

  bool operator==(const backend_spec&) const = default;
};
inline constexpr std::uint32_t max_dp_per_backend = 1024;
inline constexpr std::uint32_t max_backend_weight = 10'000;
inline constexpr std::size_t max_ranks = 4096;  // over all backends of all clusters

// A cluster: the ranks serving one set of models, with their own balancing policy.
struct cluster_spec {
  std::string name;  // unique, non-empty; the metrics' and logs' name for it
  // The body "model" values it serves, compared exactly (as vLLM compares served model names); empty only
  // in the implicit cluster (serves any model).
  std::vector<std::string> models;
  std::string policy;  // its balancing policy (a balancer::policy_names entry); defaults to settings.policy
  // A disaggregated cluster is two clusters of one name: its decode ranks (role decode, the one requests are
  // routed to by model, its index in prefill_pool's partner) and its prefill ranks (role prefill, no models
  // of its own, balanced by prefill_policy). Each pool then has its own rotation, queue and skew, as a
  // cluster has. A co-located cluster has role both and no prefill pool.
  rank_role role = rank_role::both;
  std::optional<std::size_t> prefill_pool = std::nullopt;  // decode: the index of its prefill cluster
  std::size_t decode_pool = 0;                             // prefill: the index of its decode cluster

  bool disaggregated() const noexcept { return role == rank_role::decode; }
  bool operator==(const cluster_spec&) const = default;
};
// A cluster's name goes into metric labels and log lines: [A-Za-z0-9._-], 1 to this many characters.
inline constexpr std::size_t max_cluster_name_length = 64;
// The name of the one cluster made when the configuration defines none.
inline constexpr const char* implicit_cluster_name = "default";

// The one setting that is only an environment variable: a secret on the command line would show in `ps`
// and in shell history, and one in the config file would sit in a file meant to be shared.
inline constexpr const char* admin_token_variable = "DPLB_ADMIN_TOKEN";

struct settings {
  listen_address listen;
  // Engine servers in rank order: ranks are numbered across them, so `A#dp=2, B` is ranks 0 and 1 on A
  // and rank 2 on B. With clusters, every backend of every cluster: cluster 0's first, then cluster 1's, ...
  std::vector<backend_spec> backends;
  // Never empty once parsed: without a "clusters" section, one cluster named "default" with every backend,
  // settings.policy, and no model list (it serves every model: the engines answer for unknown ones).
  std::vector<cluster_spec> clusters;
  std::size_t default_cluster = 0;  // where a request without a "model" goes
  // Balancing policy name (balancer::policy_names): "round-robin" or "least-inflight", or one of the
  // baselines kept for benchmarks, "random" and "engine-stats". The policy of every cluster that sets none.
  std::string policy = "least-inflight";
  // --prefill-policy: how a disaggregated cluster's prefill rank is picked (its decode rank by its policy).
  std::string prefill_policy = "least-inflight";
  // --pd-skip-prefill-ratio: a request whose prompt the picked decode rank already holds for at least this
  // share of its blocks (from that rank's KV-cache events) runs there in one leg. 0 = never (the default).
  double pd_skip_prefill_ratio = 0;
  // How often every backend's /metrics is read (vLLM's coordinator: 100 ms); 0 = never. Unset: 100 ms for
  // a policy that uses engine stats, never for the others (see engine_stats_interval()).
  std::optional<std::chrono::milliseconds> stats_interval;
  double kv_pressure_weight = 6.0;         // least-load's weight of KV-cache pressure
  std::uint32_t default_max_tokens = 256;  // least-tokens' generation cost of a request that sets no max
  // Prefix-aware routing and session affinity: how far above its fair share a rank may be loaded and still
  // take a request for its prefix or session (consistent hashing with bounded loads' C).
  double load_bound = 1.25;
  std::uint32_t prefix_min_match = 64;        // prefix-aware: tokens a match needs to count (estimated)
  std::uint32_t prefix_index_blocks = 16384;  // prefix-aware: prefix blocks remembered per rank
  // Precise prefix routing, from the engines' KV-cache events (backends with #kv-events=...):
  std::uint32_t block_size = 16;             // the engines' --block-size: tokens per KV-cache block
  std::uint32_t kv_index_blocks = 262'144;   // blocks indexed per rank; the oldest stored are dropped first
  tokenize_mode tokenize = tokenize_mode::off;  // how a text prompt gets the token ids the events are matched on
  std::string affinity_header;                // requests with the same value stick to one rank; empty = off
  std::chrono::milliseconds slow_start{0}; // ramp-up of a readmitted rank; 0 = off
  // Worker threads, each with its own event loop and upstream connection pool. 0 = one per CPU core.
  unsigned threads = 0;
  std::string log_level = "info";  // trace, debug, info, warn, error, critical, off
  log_format log_fmt = log_format::text;
  std::string access_log;  // --access-log: a path, "-" for standard output; empty = off

  // --- limits (bytes) ---
  std::size_t max_request_body_bytes = 64u << 20;   // larger request bodies get 413
  std::size_t max_header_bytes = 64u << 10;         // larger request/response heads get 431 / 502

  // --- timeouts ---
  std::chrono::milliseconds client_idle_timeout{60'000};     // keep-alive wait for the next request
  std::chrono::milliseconds request_read_timeout{30'000};    // whole request head+body once it started
  std::chrono::milliseconds upstream_connect_timeout{5'000};
  std::chrono::milliseconds upstream_read_timeout{600'000};  // longest silence from an engine (between bytes)
  std::chrono::milliseconds client_write_timeout{60'000};    // longest a client may take to accept bytes
  // Longest wait for an engine's response head (queueing + prefill); 0 = only upstream_read_timeout.
  // Beyond it the client gets 504. Off by default: vLLM queues without bound and a long prompt's
  // prefill can take minutes.
  std::chrono::milliseconds upstream_first_byte_timeout{0};

  // --- retries and health ---
  // Re-sends on another rank when nothing reached the client and the engine never took the request
  // (connect failed, refused, reset before any answer on a fresh connection).
  std::size_t max_retries = 2;
  std::chrono::milliseconds health_check_interval{2'000};  // GET /health on every rank; 0 = off
  std::chrono::milliseconds health_check_timeout{1'000};
  std::uint32_t unhealthy_threshold = 3;  // consecutive failed checks that take a rank down
  std::uint32_t healthy_threshold = 2;    // consecutive good checks that bring it back
  std::uint32_t ejection_threshold = 5;   // consecutive failed requests that eject a rank; 0 = never
  std::chrono::milliseconds ejection_base{5'000};   // first ejection; doubles on each repeat
  std::chrono::milliseconds ejection_max{300'000};  // cap of the doubling
  std::uint32_t max_ejected_percent = 50;  // at most this share of ranks ejected at once

  // --- queueing in dplb (off by default) ---
  // A rank with this many requests in flight takes no more; when every usable rank is full, requests
  // wait in dplb for the first slot that frees (lowest priority value, then tenants by weight, then arrival). 0 = no limit (requests go straight to the engines,
  // which queue them themselves).
  std::uint32_t max_inflight_per_rank = 0;
  std::size_t max_queued_requests = 1024;            // beyond: 429 at once
  std::chrono::milliseconds queue_timeout{30'000};   // longest wait in the queue; then 503
  // --max-queue-wait-ms: the longest a request may wait in the queue before it is answered 429 with
  // Retry-After (a tenant's max_queue_wait overrides it for that tenant's requests); 0 = none beyond
  // queue_timeout.
  std::chrono::milliseconds max_queue_wait{0};
  // --long-prompt-tokens: a queued prompt of at least this many tokens is not given a slot on a rank still
  // prefilling another such prompt while another rank is not (balancer::queue_limits); 0 = off.
  std::uint32_t long_prompt_tokens = 1024;

  // --- tenants (the config file's "tenants"; none configured: every request is the default tenant's) ---
  // As the file lists them, plain keys included. Parsing checks them by building a tenants::tenant_directory,
  // which the running dplb uses: it keeps the keys as digests only. Nothing may log or print these specs.
  std::vector<tenants::tenant_spec> tenants;
  // Refuse with 401 a request that carries no configured key (some tenant must hold one).
  bool require_api_key = false;
  // --tenant-header: a request header whose value names a configured tenant, used when no known key is
  // presented; empty = none.
  std::string tenant_header;
  fair_basis fair_by = fair_basis::requests;

  // --- connections and shutdown ---
  std::size_t max_client_connections = 10'000;  // beyond: 503 and close
  std::chrono::milliseconds drain_timeout{30'000};  // SIGTERM: longest wait for in-flight requests

  // --- upstream connection pool ---
  // Idle pooled connections older than this are closed: below vLLM's 5 s keep-alive so that dplb closes
  // first and the keep-alive race is rare (it is still handled by a transparent retry).
  std::chrono::milliseconds upstream_idle_timeout{4'000};
  std::size_t upstream_max_idle_per_rank = 256;  // per worker thread

  // --- admin API (off by default) ---
  // Its own acceptor, never the public one: unset, there is no admin listener at all.
  std::optional<listen_address> admin_listen;
  std::optional<std::string> admin_token_file;
  // The bearer token every admin request must carry: the token file's content or DPLB_ADMIN_TOKEN, trimmed
  // of surrounding whitespace. Never empty when admin_listen is set; never logged.
  std::string admin_token;

  // --- the ledger replicas share (--shared-state; off by default) ---
  // Where it lives, parsed (the password from --shared-state-password-file when given). Never logged whole:
  // it may hold the password.
  std::optional<ledger::redis_endpoint> shared_state;
  std::optional<std::string> shared_state_password_file;
  std::string replica_name;  // this replica's name in the ledger; empty until resolved: host name and pid
  std::chrono::milliseconds shared_state_timeout{20};  // every pick, release and registration

  std::optional<std::string> config_file;  // the file that was read, if any (for the start-up log)
};

inline constexpr std::chrono::milliseconds default_stats_interval{100};

// How often the engines' /metrics are read: as configured, else the default for a policy that balances on
// engine stats (`uses_engine_stats`), else never (0).
inline std::chrono::milliseconds engine_stats_interval(const settings& s, bool uses_engine_stats) {
  return s.stats_interval.value_or(uses_engine_stats ? default_stats_interval : std::chrono::milliseconds(0));
}

// Whether some cluster runs its requests in two legs (prefill, then decode).
inline bool any_cluster_disaggregated(const settings& s) {
  return std::ranges::any_of(s.clusters, [](const cluster_spec& c) { return c.disaggregated(); });
}

// Whether some backend publishes KV-cache events (#kv-events=...).
inline bool any_backend_has_kv_events(const settings& s) {
  return std::ranges::any_of(s.backends, [](const backend_spec& b) { return b.kv_events.has_value(); });
}

// Whether some cluster (the implicit "default" one included) balances with `policy`.
inline bool any_cluster_uses(const settings& s, std::string_view policy) {
  return std::ranges::any_of(s.clusters, [&](const cluster_spec& c) { return c.policy == policy; });
}

// The process environment as name -> value (only DPLB_* entries matter). Tests pass their own.
using environment = std::map<std::string, std::string>;
environment process_environment();

// What parse_command_line returns: either settings to run with, or text to print and exit 0 with
// (--help, --version).
struct parse_result {
  std::optional<settings> run;
  std::string print_and_exit;
};

// Parses argv (argv[0] is the program name), then the environment, then the config file named by
// --config or DPLB_CONFIG, applying precedence command line > environment > config file > defaults.
// The backends come whole from one source: --backend, else DPLB_BACKENDS, else the file's "clusters" or
// "backends" (a file holds one of the two).
// Throws config_error with a one-line message on any problem (unknown flag, bad value, no backend, ...).
parse_result parse_command_line(int argc, const char* const* argv, const environment& env);

// Validates one engine URL as --backend does, options after '#' included, and writes its normal form
// (http://host:port: lower-case host, explicit port, no trailing slash) to out.url. Returns why the URL is
// refused, or "" when it is good. The admin API matches a backend by this same normal form.
std::string parse_backend(std::string_view text, backend_spec& out);

// Text of --help (every option, its environment variable, config key and default).
std::string help_text();

}  // namespace dplb::config
