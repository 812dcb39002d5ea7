#include "option_table.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>

#include <boost/beast/http/field.hpp>

#include "dplb/ledger/redis_url.hpp"
#include "dplb/support/policy_names.hpp"
#include "dplb/http/header_sanitizer.hpp"
#include "value_parsers.hpp"

namespace dplb::config::detail {
namespace {

using support::policy_names;

// Accepted values of the enumerated options. Each list is the single place to extend: --help, the error
// messages and the docs' wording are all generated from it. spdlog's level names (spdlog::level::from_str); "warning" and "err" aliases are left out so that one
// spelling is documented.
constexpr std::array<std::string_view, 7> log_level_names{"trace", "debug", "info",    "warn",
                                                          "error", "critical", "off"};
constexpr std::array<std::string_view, 2> log_format_names{"text", "json"};
constexpr std::array<std::string_view, 2> tokenize_mode_names{"off", "engine"};
constexpr std::array<std::string_view, 2> fair_basis_names{"requests", "tokens"};

// HTTP's token characters (RFC 9110 5.6.2), the ones a header's name is made of.
bool is_token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// --tenant-header: a name a client's header can have and that reaches dplb's request path as sent. A
// hop-by-hop header is the connection's, not the request's (and may be stripped on the way); Authorization
// carries the keys, and Host, Content-Length and Transfer-Encoding frame and address the request.
std::string check_tenant_header(std::string_view name) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), is_token_char)) {
    return "expected a header name (letters, digits and !#$%&'*+-.^_`|~), e.g. x-tenant";
  }
  namespace bhttp = boost::beast::http;
  const bhttp::field field = bhttp::string_to_field(name);
  if (http::is_hop_by_hop(field)) return "a hop-by-hop header belongs to the connection; use another, e.g. x-tenant";
  for (const bhttp::field reserved : {bhttp::field::authorization, bhttp::field::host, bhttp::field::content_length,
                                      bhttp::field::transfer_encoding}) {
    if (field == reserved) {
      return "this header carries the request's key, address or framing; use another, e.g. x-tenant";
    }
  }
  return {};
}

// The option table: one row per option, in --help order. Environment names and config keys are spelled out
// (not derived) so that a search for DPLB_LOG_FORMAT lands here; the unit tests check they follow the rule
// DPLB_<FLAG_UPPER_SNAKE> / flag_snake, with "backends" (plural) the one deliberate exception.
// Number options differ only in their names, range and the member they set: these build their rows.
template <auto member>
constexpr option_spec ms_option(std::string_view flag, std::string_view env, std::string_view key, std::uint64_t min,
                                std::uint64_t max, std::string_view meaning) {
  return option_spec{.flag = flag, .env = env, .key = key, .value_name = "MS", .meaning = meaning,
                     .kind = value_kind::number, .min = min, .max = max, .unit = "ms",
                     .set_number = [](settings& s, std::uint64_t n) { s.*member = std::chrono::milliseconds(n); },
                     .show_default = [](const settings& s) { return std::to_string((s.*member).count()); }};
}

// The prefix index (balancer/prefix_index.hpp) numbers the blocks it holds with 32-bit ids, the last one
// meaning "none", and holds up to --prefix-index-blocks for each of up to max_ranks ranks (backends added
// by SIGHUP or the admin API included): their product must leave an id to spare.
constexpr std::uint64_t prefix_index_ids = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t max_prefix_index_blocks = prefix_index_ids / max_ranks;
static_assert(max_prefix_index_blocks * max_ranks <= prefix_index_ids);

// The KV-event index's node ids are 32-bit too (kv/block_index.hpp), UINT32_MAX meaning "none".
constexpr std::uint64_t max_kv_index_blocks = prefix_index_ids / max_ranks;

template <auto member>
constexpr option_spec count_option(std::string_view flag, std::string_view env, std::string_view key,
                                   std::string_view value_name, std::uint64_t min, std::uint64_t max,
                                   std::string_view unit, std::string_view meaning) {
  return option_spec{.flag = flag, .env = env, .key = key, .value_name = value_name, .meaning = meaning,
                     .kind = value_kind::number, .min = min, .max = max, .unit = unit,
                     .set_number =
                         [](settings& s, std::uint64_t n) {
                           s.*member = static_cast<std::remove_cvref_t<decltype(s.*member)>>(n);
                         },
                     .show_default = [](const settings& s) { return std::to_string(s.*member); }};
}

constexpr std::array option_table{
    option_spec{.flag = "help", .meaning = "Print this help and exit.", .kind = value_kind::flag},
    option_spec{.flag = "version", .meaning = "Print the version and exit.", .kind = value_kind::flag},
    option_spec{.flag = "check-config",
                .meaning = "Check the configuration (command line, environment, config file) and exit: 0 with a "
                           "summary when dplb would start with it, 2 with the error otherwise. Nothing is "
                           "resolved, bound or started, so a file for another host can be checked here.",
                .kind = value_kind::flag},
    option_spec{
        .flag = "listen",
        .env = "DPLB_LISTEN",
        .key = "listen",
        .value_name = "HOST:PORT",
        .meaning = "Address to accept clients on: an IP address or host name and a port; IPv6 in brackets "
                   "([::1]:8000); port 0 picks a free port.",
        .set_text = [](settings& s, std::string_view v) { return parse_listen(v, s.listen); },
        .show_default = [](const settings& s) { return format_listen(s.listen); }},
    option_spec{
        .flag = "backend",
        .env = "DPLB_BACKENDS",
        .key = "backends",
        .value_name = "URL",
        .meaning = "Engine base URL, http://HOST:PORT (port 80 if omitted), optionally followed by "
                   "#dp=N (N DP ranks behind the URL, as `vllm serve --data-parallel-size N` serves them: dplb "
                   "tells each request's rank in X-data-parallel-rank: 0..N-1) and/or #weight=W (each of its "
                   "ranks gets W times the share of a weight-1 rank), e.g. http://h:8000#dp=4&weight=2, and/or "
                   "#kv-events=tcp://HOST:PORT (its engines' KV-cache event publishers, vLLM's --kv-events-config "
                   "endpoint, rank j on PORT+j: prefix-aware then routes by what each rank caches) with optional "
                   "&kv-replay=tcp://HOST:PORT (their replay endpoint, for events a gap lost). "
                   "Repeatable, and a value may be a comma-separated list; ranks are numbered in this order "
                   "over all backends (A#dp=2 then B: ranks 0 and 1 on A, 2 on B). Required, unless the config "
                   "file defines clusters (see --config).",
        .kind = value_kind::url_list,
        .show_default = [](const settings&) { return std::string("none (required)"); }},
    option_spec{
        .flag = "prefill",
        .env = "DPLB_PREFILL",
        .key = "prefill",
        .value_name = "URL",
        .meaning = "Prefill/decode disaggregation: a prefill engine's base URL, with the fragments of --backend "
                   "(#dp=N, #weight=W, #kv-events=...). With --decode, and instead of --backend: every POST "
                   "/v1/completions and /v1/chat/completions runs in two legs, as vLLM's disaggregated proxy "
                   "runs them: a prefill rank (--prefill-policy) computes the prompt's KV cache (max_tokens 1, "
                   "kv_transfer_params do_remote_decode), then a decode rank (--policy, picked when the "
                   "request arrives) pulls it with the prefill's kv_transfer_params and generates; both legs "
                   "carry one X-Request-Id. Other paths go to a decode rank. Repeatable, and a value may be a "
                   "comma-separated list.",
        .kind = value_kind::url_list,
        .show_default = [](const settings&) { return std::string("none"); }},
    option_spec{
        .flag = "decode",
        .env = "DPLB_DECODE",
        .key = "decode",
        .value_name = "URL",
        .meaning = "Prefill/decode disaggregation: a decode engine's base URL, with the fragments of --backend; "
                   "see --prefill. Repeatable, and a value may be a comma-separated list.",
        .kind = value_kind::url_list,
        .show_default = [](const settings&) { return std::string("none"); }},
    option_spec{.flag = "policy",
                .env = "DPLB_POLICY",
                .key = "policy",
                .meaning = "How to pick a rank for each request; every policy honours the backends' weights. "
                           "least-inflight: the rank with the fewest requests dplb has in flight there, ties taken "
                           "in turn; round-robin: each rank in turn; least-load: dplb's in-flight count plus the "
                           "load the engine reports (running + waiting, from its /metrics) beyond what dplb had in "
                           "flight there at that read, plus --kv-pressure-weight * waiting * max(0, KV-cache usage "
                           "- 0.5): vLLM's score, never below what dplb knows it sent; least-tokens: the "
                           "fewest tokens outstanding (prompt tokens until the first response byte, plus "
                           "max_tokens or --default-max-tokens until the end); prefix-aware: the rank that was sent the longest "
                           "prefix of the request's prompt (at least --prefix-min-match), while it is within "
                           "--load-bound, else least-inflight. Baselines for benchmarks, not for "
                           "serving: random, and engine-stats (lowest 4*waiting+running from the engines' "
                           "/metrics, read every --stats-interval, as vLLM's own client balances).",
                .kind = value_kind::choice,
                .choices = policy_names,
                .set_text = [](settings& s, std::string_view v) { return (s.policy = v, std::string()); },
                .show_default = [](const settings& s) { return s.policy; }},
    option_spec{.flag = "prefill-policy",
                .env = "DPLB_PREFILL_POLICY",
                .key = "prefill_policy",
                .meaning = "With --prefill/--decode: how to pick the prefill rank of a request (--policy picks its "
                           "decode rank). least-inflight spreads prompts evenly; prefix-aware sends a prompt where "
                           "its prefix was prefilled; least-tokens weighs prompt lengths.",
                .kind = value_kind::choice,
                .choices = policy_names,
                .set_text = [](settings& s, std::string_view v) { return (s.prefill_policy = v, std::string()); },
                .show_default = [](const settings& s) { return s.prefill_policy; }},
    option_spec{.flag = "pd-skip-prefill-ratio",
                .env = "DPLB_PD_SKIP_PREFILL_RATIO",
                .key = "pd_skip_prefill_ratio",
                .value_name = "R",
                .meaning = "With --prefill/--decode and KV-cache events from the decode ranks (#kv-events= on "
                           "--decode): a request whose prompt the picked decode rank already holds for at least R "
                           "of its blocks skips the prefill leg and runs on that rank alone. Tokens must be known "
                           "(prompts as token ids, or --tokenize engine). From 0 to 1; 0 = never.",
                .kind = value_kind::decimal,
                .set_text = [](settings& s, std::string_view v) {
                  double r = 0;
                  if (auto error = parse_weight(v, r); !error.empty() || r > 1)
                    return std::string("expected a number from 0 to 1, e.g. 0.8 (0 = never)");
                  s.pd_skip_prefill_ratio = r;
                  return std::string();
                },
                .show_default = [](const settings& s) { return format_weight(s.pd_skip_prefill_ratio); }},
    option_spec{.flag = "stats-interval",
                .env = "DPLB_STATS_INTERVAL",
                .key = "stats_interval",
                .value_name = "MS",
                .meaning = "How often every backend's /metrics is read for its engines' running, waiting and "
                           "KV-cache numbers (exported as dplb_engine_*; least-load and engine-stats balance on "
                           "them). vLLM's DP coordinator publishes every 100 ms. Numbers older than 3 intervals "
                           "plus --health-check-timeout-ms are stale and ignored. By default the engines are read "
                           "only for a policy that uses the numbers (a busy vLLM API server spends real time "
                           "rendering /metrics); set it to read them under any policy. 0 = never.",
                .kind = value_kind::number,
                .min = 0,
                .max = max_timeout_ms,
                .unit = "ms",
                .set_number = [](settings& s, std::uint64_t n) { s.stats_interval = std::chrono::milliseconds(n); },
                .show_default =
                    [](const settings&) { return std::string("100 with least-load or engine-stats, else 0"); }},
    option_spec{.flag = "kv-pressure-weight",
                .env = "DPLB_KV_PRESSURE_WEIGHT",
                .key = "kv_pressure_weight",
                .value_name = "W",
                .meaning = "least-load: the weight of KV-cache pressure, W * waiting * max(0, usage - 0.5), added to "
                           "a rank's load (vLLM's balancer uses 6); 0 ignores the KV cache.",
                .kind = value_kind::decimal,
                .set_text = [](settings& s, std::string_view v) { return parse_weight(v, s.kv_pressure_weight); },
                .show_default = [](const settings& s) { return format_weight(s.kv_pressure_weight); }},
    count_option<&settings::default_max_tokens>("default-max-tokens", "DPLB_DEFAULT_MAX_TOKENS", "default_max_tokens", "N", 1, 10'000'000, "tokens",
                                  "least-tokens: the generation a request is assumed to cost when it sets neither "
                                  "max_tokens nor max_completion_tokens."),
    option_spec{.flag = "load-bound",
                .env = "DPLB_LOAD_BOUND",
                .key = "load_bound",
                .value_name = "C",
                .meaning = "prefix-aware and --affinity-header: a rank takes a request for its prefix or session "
                           "only while its requests in flight stay within C times its fair share of all in flight "
                           "(this one included, rounded up; consistent hashing with bounded loads). Lower keeps "
                           "the ranks even, higher keeps more requests where their cache is. From 1 to 100.",
                .kind = value_kind::decimal,
                .set_text = [](settings& s, std::string_view v) {
                  double c = 0;
                  if (auto error = parse_weight(v, c); !error.empty() || c < 1 || c > 100)
                    return std::string("expected a number from 1 to 100, e.g. 1.25");
                  s.load_bound = c;
                  return std::string();
                },
                .show_default = [](const settings& s) { return format_weight(s.load_bound); }},
    count_option<&settings::prefix_min_match>("prefix-min-match", "DPLB_PREFIX_MIN_MATCH", "prefix_min_match", "TOKENS", 16, 1'000'000, "tokens",
                                  "prefix-aware: the shortest matched prefix that sends a request to the rank that "
                                  "saw it, in tokens estimated at 4 bytes each (matches count in blocks of 64, rounded up)."),
    [] {
      auto o = count_option<&settings::prefix_index_blocks>("prefix-index-blocks", "DPLB_PREFIX_INDEX_BLOCKS", "prefix_index_blocks", "N", 1, max_prefix_index_blocks, "blocks",
                                  "prefix-aware: prompt blocks (256 bytes, about 64 tokens, each) remembered per rank; "
                                  "the least recently used go first. About 50 bytes of memory each: the default holds about "
                                  "1 Mi tokens of prefixes per rank in under 1 MiB.");
      o.why_max = "the prefix index numbers its blocks with 32-bit ids, and this many blocks for each of up to 4096 "
                  "ranks must fit in them";
      return o;
    }(),
    count_option<&settings::block_size>("block-size", "DPLB_BLOCK_SIZE", "block_size", "TOKENS", 1, 65'536, "tokens",
                                  "prefix-aware with KV-cache events: tokens per KV-cache block, exactly as the "
                                  "engines' --block-size (vLLM's default 16). A stored block's tokens must be "
                                  "whole blocks of this size for a request to match them."),
    [] {
      auto o = count_option<&settings::kv_index_blocks>("kv-index-blocks", "DPLB_KV_INDEX_BLOCKS", "kv_index_blocks", "N", 1, max_kv_index_blocks, "blocks",
                                  "prefix-aware with KV-cache events: the most blocks indexed per rank. Beyond it the "
                                  "block stored longest ago is dropped first (a chain's tail before its head). At or "
                                  "above the engines' num_gpu_blocks nothing they still hold is dropped. About 80 "
                                  "bytes each, taken only as events arrive.");
      o.why_max = "the KV-event index numbers its blocks with 32-bit ids, and this many blocks for each of up to "
                  "4096 ranks must fit in them";
      return o;
    }(),
    option_spec{.flag = "tokenize",
                .env = "DPLB_TOKENIZE",
                .key = "tokenize",
                .meaning = "prefix-aware with KV-cache events: where the token ids of a text prompt or of chat "
                           "messages come from. off: text is matched by the approximate index (prompts given "
                           "as token ids always match the events); engine: the cluster's engine tokenizes it "
                           "with POST /tokenize (the chat template applied, as for serving), one more round "
                           "trip before the pick.",
                .kind = value_kind::choice,
                .choices = tokenize_mode_names,
                .set_text =
                    [](settings& s, std::string_view v) {
                      s.tokenize = v == "engine" ? tokenize_mode::engine : tokenize_mode::off;
                      return std::string();
                    },
                .show_default =
                    [](const settings& s) { return std::string(s.tokenize == tokenize_mode::engine ? "engine" : "off"); }},
    option_spec{.flag = "affinity-header",
                .env = "DPLB_AFFINITY_HEADER",
                .key = "affinity_header",
                .value_name = "NAME",
                .meaning = "Session affinity, under any policy: requests with the same value of this header (e.g. "
                           "x-session-id) go to the same rank, by consistent hashing with bounded loads "
                           "(--load-bound), so that a conversation stays where its KV cache is without making a "
                           "hot spot; few sessions move when ranks come or go. Requests without it follow the "
                           "policy. Off by default.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty() || v.find_first_of(" \t:\r\n") != std::string_view::npos)
                    return std::string("expected a header name, e.g. x-session-id");
                  s.affinity_header = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    ms_option<&settings::slow_start>("slow-start", "DPLB_SLOW_START", "slow_start", 0, max_timeout_ms,
                                  "A rank readmitted after failed health checks or an ejection starts at a tenth of "
                                  "its weight and ramps up linearly over this long, so that a cold engine is not "
                                  "flooded. 0 = off."),
    option_spec{.flag = "threads",
                .env = "DPLB_THREADS",
                .key = "threads",
                .value_name = "N",
                .meaning = "Worker threads, each with its own event loop and upstream connections; 0 = one "
                           "per CPU core.",
                .kind = value_kind::number,
                .min = 0,
                .max = 256,
                .unit = "threads",
                .set_number = [](settings& s, std::uint64_t n) { s.threads = static_cast<unsigned>(n); },
                .show_default = [](const settings& s) { return std::to_string(s.threads); }},
    option_spec{.flag = "config",
                .env = "DPLB_CONFIG",
                .value_name = "FILE",
                .meaning = "JSON config file whose keys are the options' names in snake_case; unknown keys "
                           "are an error. Only the file defines clusters (several models behind one dplb), \"clusters\": [{\"name\", \"models\", "
                           "\"backends\", \"policy\", \"default\"}, ...]: a request goes to the cluster that "
                           "lists its body's \"model\", one without a model to the default cluster. A file holds "
                           "\"clusters\" or \"backends\", not both; --backend and DPLB_BACKENDS replace its "
                           "clusters. Only the file defines tenants too, \"tenants\": [{\"name\", \"api_keys\", "
                           "\"api_key_sha256\", \"weight\", \"requests_per_second\", \"burst\", \"max_queued\", "
                           "\"tokens_per_minute\", \"max_queue_wait_ms\", \"min_priority\"}, ...]: a request is the "
                           "tenant of its Bearer key, else the keyless one --tenant-header names, else \"default\". "
                           "See docs/configuration.md.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty()) return std::string("expected a file path");
                  s.config_file = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    option_spec{.flag = "log-level",
                .env = "DPLB_LOG_LEVEL",
                .key = "log_level",
                .meaning = "Least severe log messages written.",
                .kind = value_kind::choice,
                .choices = log_level_names,
                .set_text = [](settings& s, std::string_view v) { return (s.log_level = v, std::string()); },
                .show_default = [](const settings& s) { return s.log_level; }},
    option_spec{.flag = "log-format",
                .env = "DPLB_LOG_FORMAT",
                .key = "log_format",
                .meaning = "Log line format: human-readable text or one JSON object per line.",
                .kind = value_kind::choice,
                .choices = log_format_names,
                .set_text =
                    [](settings& s, std::string_view v) {
                      s.log_fmt = v == "json" ? log_format::json : log_format::text;
                      return std::string();
                    },
                .show_default =
                    [](const settings& s) { return std::string(s.log_fmt == log_format::json ? "json" : "text"); }},
    option_spec{.flag = "access-log",
                .env = "DPLB_ACCESS_LOG",
                .key = "access_log",
                .value_name = "PATH",
                .meaning = "Write an access log to PATH ('-': standard output), one JSON object per line and "
                           "request: time, rank, method, path, status, bytes, ttfb, duration, tokens, model, "
                           "client. Written by a thread of its own every 100 ms, never by the event loops: a full "
                           "buffer drops lines (dplb_access_log_dropped_total) rather than slow a request. SIGHUP "
                           "reopens the file (log rotation). Off by default.",
                .set_text = [](settings& s, std::string_view v) {
                  s.access_log = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    count_option<&settings::max_request_body_bytes>("max-request-body-bytes", "DPLB_MAX_REQUEST_BODY_BYTES", "max_request_body_bytes", "BYTES", 1, std::uint64_t{4} << 30, "bytes",
                                  "Largest request body accepted; larger ones get 413."),
    count_option<&settings::max_header_bytes>("max-header-bytes", "DPLB_MAX_HEADER_BYTES", "max_header_bytes", "BYTES", 1, std::uint64_t{64} << 10, "bytes",
                                  "Largest request or response head (start line and headers); larger request heads "
                           "get 431, larger response heads 502. At most 64 KiB: Beast refuses longer header "
                           "fields."),
    ms_option<&settings::client_idle_timeout>("client-idle-timeout-ms", "DPLB_CLIENT_IDLE_TIMEOUT_MS", "client_idle_timeout_ms", 1, max_timeout_ms,
                                  "How long a client connection may take to deliver its next request head, waiting included; "
                                  "then it is closed (an unfinished head counts as 408)."),
    ms_option<&settings::request_read_timeout>("request-read-timeout-ms", "DPLB_REQUEST_READ_TIMEOUT_MS", "request_read_timeout_ms", 1, max_timeout_ms,
                                  "How long a client may take to send a request body once the head has arrived "
                           "(the head itself is bounded by --client-idle-timeout-ms)."),
    ms_option<&settings::upstream_connect_timeout>("upstream-connect-timeout-ms", "DPLB_UPSTREAM_CONNECT_TIMEOUT_MS", "upstream_connect_timeout_ms", 1, max_timeout_ms,
                                  "How long connecting to an engine may take."),
    ms_option<&settings::upstream_read_timeout>("upstream-read-timeout-ms", "DPLB_UPSTREAM_READ_TIMEOUT_MS", "upstream_read_timeout_ms", 1, max_timeout_ms,
                                  "Longest silence allowed from an engine between response bytes (including the "
                           "wait for the first byte)."),
    ms_option<&settings::client_write_timeout>("client-write-timeout-ms", "DPLB_CLIENT_WRITE_TIMEOUT_MS", "client_write_timeout_ms", 1, max_timeout_ms,
                                  "Longest a client may take to accept bytes written to it."),
    ms_option<&settings::upstream_idle_timeout>("upstream-idle-timeout-ms", "DPLB_UPSTREAM_IDLE_TIMEOUT_MS", "upstream_idle_timeout_ms", 1, max_timeout_ms,
                                  "Idle pooled engine connections older than this are closed; keep it below the "
                           "engine's keep-alive (vLLM: 5 s)."),
    count_option<&settings::upstream_max_idle_per_rank>("upstream-max-idle-per-rank", "DPLB_UPSTREAM_MAX_IDLE_PER_RANK", "upstream_max_idle_per_rank", "N", 0, 65536, "connections",
                                  "Most idle connections kept per engine by each worker thread; 0 keeps none."),
    ms_option<&settings::upstream_first_byte_timeout>("upstream-first-byte-timeout-ms", "DPLB_UPSTREAM_FIRST_BYTE_TIMEOUT_MS", "upstream_first_byte_timeout_ms", 0, max_timeout_ms,
                                  "Longest wait for an engine's response head; beyond it the client gets 504 and the request is not re-sent. vLLM sends a stream's head at once but a non-streaming head only after the whole generation: size it for that. 0 = only --upstream-read-timeout-ms."),
    count_option<&settings::max_retries>("max-retries", "DPLB_MAX_RETRIES", "max_retries", "N", 0, 10, "retries",
                                  "Times a request is re-sent to another rank when its rank failed before taking it (connect failed, refused, reset before any answer). Never after a response byte reached the client."),
    ms_option<&settings::health_check_interval>("health-check-interval-ms", "DPLB_HEALTH_CHECK_INTERVAL_MS", "health_check_interval_ms", 0, max_timeout_ms,
                                  "Interval of the active health checks (GET /health on every rank); 0 turns them off."),
    ms_option<&settings::health_check_timeout>("health-check-timeout-ms", "DPLB_HEALTH_CHECK_TIMEOUT_MS", "health_check_timeout_ms", 1, max_timeout_ms,
                                  "Longest a health check may take (connect and answer); slower counts as failed."),
    count_option<&settings::unhealthy_threshold>("unhealthy-threshold", "DPLB_UNHEALTHY_THRESHOLD", "unhealthy_threshold", "N", 1, 1000, "checks",
                                  "Consecutive failed health checks that take a rank down."),
    count_option<&settings::healthy_threshold>("healthy-threshold", "DPLB_HEALTHY_THRESHOLD", "healthy_threshold", "N", 1, 1000, "checks",
                                  "Consecutive good health checks that bring a down rank back."),
    count_option<&settings::ejection_threshold>("ejection-threshold", "DPLB_EJECTION_THRESHOLD", "ejection_threshold", "N", 0, 100000, "requests",
                                  "Consecutive failed requests (connect failure, reset, timeout, 5xx) that eject a rank; 0 = never eject."),
    ms_option<&settings::ejection_base>("ejection-base-ms", "DPLB_EJECTION_BASE_MS", "ejection_base_ms", 1, max_timeout_ms,
                                  "How long the first ejection lasts; each repeat doubles it."),
    ms_option<&settings::ejection_max>("ejection-max-ms", "DPLB_EJECTION_MAX_MS", "ejection_max_ms", 1, max_timeout_ms,
                                  "Longest ejection; a rank clean for this long has its ejection history forgiven."),
    count_option<&settings::max_ejected_percent>("max-ejected-percent", "DPLB_MAX_EJECTED_PERCENT", "max_ejected_percent", "PERCENT", 0, 100, "%",
                                  "Most ranks ejected at once, as a share of all ranks (passive ejection never takes more out, however many fail together)."),
    count_option<&settings::max_inflight_per_rank>("max-inflight-per-rank", "DPLB_MAX_INFLIGHT_PER_RANK", "max_inflight_per_rank", "N", 0, 1000000, "requests",
                                  "Requests in flight a rank may hold; when no usable rank with room suits a request, it waits in dplb (by body priority, then tenant weight, then arrival; a request whose prefix or session rank is full waits for that rank, within --load-bound, for up to half of --queue-timeout-ms). 0 = no limit and no queueing."),
    count_option<&settings::max_queued_requests>("max-queued-requests", "DPLB_MAX_QUEUED_REQUESTS", "max_queued_requests", "N", 0, 10000000, "requests",
                                  "Most requests waiting in dplb's queue (with --max-inflight-per-rank); beyond it new requests get 429."),
    ms_option<&settings::queue_timeout>("queue-timeout-ms", "DPLB_QUEUE_TIMEOUT_MS", "queue_timeout_ms", 1, max_timeout_ms,
                                  "Longest a request waits in dplb's queue; then it gets 503."),
    count_option<&settings::long_prompt_tokens>("long-prompt-tokens", "DPLB_LONG_PROMPT_TOKENS", "long_prompt_tokens", "N", 0, 100000000, "tokens",
                                  "With --max-inflight-per-rank: a queued request whose prompt has at least N tokens "
                                  "(counted from token ids, else estimated from the text) is not given a slot on a "
                                  "rank still prefilling another such prompt while some other usable rank is not; "
                                  "it takes the next slot freed there instead (or the busy rank's once that prefill "
                                  "ends), for at most 500 ms. On a rank already prefilling one, its first token would "
                                  "come a whole prefill later. 0 = off."),
    ms_option<&settings::max_queue_wait>("max-queue-wait-ms", "DPLB_MAX_QUEUE_WAIT_MS", "max_queue_wait_ms", 0, max_timeout_ms,
                                  "Longest a request may wait in dplb's queue (with --max-inflight-per-rank) before it "
                                  "is answered 429 with Retry-After, before any engine sees it; a tenant's "
                                  "max_queue_wait_ms overrides it for that tenant's requests. 0 = no limit beyond "
                                  "--queue-timeout-ms (whose 503 comes first when it is shorter)."),
    option_spec{.flag = "require-api-key",
                .env = "DPLB_REQUIRE_API_KEY",
                .key = "require_api_key",
                .meaning = "Refuse with 401 (in OpenAI's error shape) every request that presents no key of a "
                           "configured tenant (Authorization: Bearer KEY; the keys are the config file's "
                           "\"tenants\", see docs/configuration.md). dplb's own /health and /metrics need none. "
                           "Some tenant must hold a key. On the command line the flag alone; true or false in "
                           "the environment and the config file.",
                .kind = value_kind::boolean,
                .set_text = [](settings& s, std::string_view v) { return (s.require_api_key = v == "true", std::string()); },
                .show_default = [](const settings& s) { return std::string(s.require_api_key ? "true" : "false"); }},
    option_spec{.flag = "tenant-header",
                .env = "DPLB_TENANT_HEADER",
                .key = "tenant_header",
                .value_name = "NAME",
                .meaning = "A request header (e.g. x-tenant) whose value names a configured tenant without keys: "
                           "a request that presents no known key is that tenant's; a name no tenant has, or a "
                           "tenant that holds keys (reached by its keys only), counts as the default tenant. Trusted as sent: meant to be set by a gateway in front of dplb (with "
                           "untrusted clients, use --require-api-key). Off by default.",
                .set_text = [](settings& s, std::string_view v) {
                  if (auto why = check_tenant_header(v); !why.empty()) return why;
                  s.tenant_header = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    option_spec{.flag = "fair-by",
                .env = "DPLB_FAIR_BY",
                .key = "fair_by",
                .meaning = "When requests queue (--max-inflight-per-rank), how tenants of one priority share the "
                           "freed slots by their weights: counting requests, or counting each request's tokens "
                           "(its prompt plus max_tokens).",
                .kind = value_kind::choice,
                .choices = fair_basis_names,
                .set_text =
                    [](settings& s, std::string_view v) {
                      s.fair_by = v == "tokens" ? fair_basis::tokens : fair_basis::requests;
                      return std::string();
                    },
                .show_default =
                    [](const settings& s) { return std::string(s.fair_by == fair_basis::tokens ? "tokens" : "requests"); }},
    count_option<&settings::max_client_connections>("max-client-connections", "DPLB_MAX_CLIENT_CONNECTIONS", "max_client_connections", "N", 1, 10000000, "connections",
                                  "Most client connections open at once; beyond it new connections get 503 and are closed."),
    ms_option<&settings::drain_timeout>("drain-timeout-ms", "DPLB_DRAIN_TIMEOUT_MS", "drain_timeout_ms", 1, max_timeout_ms,
                                  "On SIGTERM or SIGINT: longest wait for requests in flight to finish before exiting."),
    option_spec{
        .flag = "admin-listen",
        .env = "DPLB_ADMIN_LISTEN",
        .key = "admin_listen",
        .value_name = "HOST:PORT",
        .meaning = "Serve the admin API (list ranks and backends, add and remove backends, drain and undrain "
                   "ranks or backends, set weights; see docs/operations.md) on this address, a listener of its own: the public port never serves it. "
                   "Needs a token (--admin-token-file or DPLB_ADMIN_TOKEN); bind it to a private address.",
        .set_text = [](settings& s, std::string_view v) { return parse_listen(v, s.admin_listen.emplace()); },
        .show_default = [](const settings&) { return std::string("none (no admin API)"); }},
    option_spec{.flag = "admin-token-file",
                .env = "DPLB_ADMIN_TOKEN_FILE",
                .key = "admin_token_file",
                .value_name = "FILE",
                .meaning = "File holding the admin API's bearer token (surrounding whitespace is ignored), "
                           "readable by its owner alone (else a warning); SIGHUP reads it again. "
                           "Alternatively set the token itself in the environment variable DPLB_ADMIN_TOKEN "
                           "(never on the command line, where `ps` shows it); not both.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty()) return std::string("expected a file path");
                  s.admin_token_file = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    option_spec{.flag = "shared-state",
                .env = "DPLB_SHARED_STATE",
                .key = "shared_state",
                .value_name = "URL",
                .meaning = "redis://[USER:PASSWORD@]HOST:PORT[/DB]: share one ledger of requests in flight with "
                           "the other dplb replicas that name the same Redis (7 or later) and the same backend "
                           "list, so that every pick counts every replica's requests and a burst through several "
                           "replicas lands as evenly as through one (docs/scaling.md). Redis unreachable, paused "
                           "or restarted: each replica serves by its own counts, at most one "
                           "--shared-state-timeout-ms later, and rejoins within 5 s of its return.",
                .set_text = [](settings& s, std::string_view v) {
                  try {
                    s.shared_state = ledger::parse_redis_url(v);
                  } catch (const ledger::redis_url_error& e) {
                    std::string why = e.what();
                    constexpr std::string_view named = "--shared-state: ";
                    if (why.starts_with(named)) why.erase(0, named.size());
                    return why;
                  }
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none (each replica counts alone)"); },
                .shows_value = false},
    option_spec{.flag = "shared-state-password-file",
                .env = "DPLB_SHARED_STATE_PASSWORD_FILE",
                .key = "shared_state_password_file",
                .value_name = "FILE",
                .meaning = "File holding the password of --shared-state's Redis (surrounding whitespace is "
                           "ignored), instead of one in its URL; never logged.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty()) return std::string("expected a file path");
                  s.shared_state_password_file = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("none"); }},
    option_spec{.flag = "replica-name",
                .env = "DPLB_REPLICA_NAME",
                .key = "replica_name",
                .value_name = "NAME",
                .meaning = "This replica's name in the shared ledger (--shared-state): unique among the replicas; "
                           "a replica restarted under the same name replaces its former counts at once.",
                .set_text = [](settings& s, std::string_view v) {
                  if (v.empty() || v.size() > 200 ||
                      v.find_first_of(" \t\r\n") != std::string_view::npos) {
                    return std::string("expected a name of 1 to 200 characters without spaces, e.g. dplb-0");
                  }
                  s.replica_name = std::string(v);
                  return std::string();
                },
                .show_default = [](const settings&) { return std::string("HOST:PID (host name and process id)"); }},
    ms_option<&settings::shared_state_timeout>("shared-state-timeout-ms", "DPLB_SHARED_STATE_TIMEOUT_MS",
                                               "shared_state_timeout_ms", 1, 10'000,
                                               "--shared-state: longest wait for the ledger's answer to a pick; "
                                               "past it the request is picked by this replica's own counts."),
};

}  // namespace

std::span<const option_spec> options() { return option_table; }

const option_spec& find_option(std::string_view flag) {
  for (const auto& o : option_table) {
    if (o.flag == flag) return o;
  }
  throw std::logic_error("dplb: no option --" + std::string(flag));
}

std::string value_name_of(const option_spec& o) {
  return o.kind == value_kind::choice ? join(o.choices, "|", "|") : std::string(o.value_name);
}

const option_spec& backend_option() {
  static const option_spec& backend = find_option("backend");
  return backend;
}
const option_spec& prefill_option() {
  static const option_spec& prefill = find_option("prefill");
  return prefill;
}
const option_spec& decode_option() {
  static const option_spec& decode = find_option("decode");
  return decode;
}

[[noreturn]] void bad_value(const option_spec& o, const raw_value& v, std::string_view shown,
                            std::string_view why) {
  throw config_error("invalid --" + std::string(o.flag) + " '" + std::string(shown) + "'" + v.origin + ": " +
                     std::string(why));
}

void apply(const option_spec& o, const raw_value& v, settings& s) {
  switch (o.kind) {
    case value_kind::url_list: {
      rank_list ranks;
      ranks.add(v, 0, "");
      s.backends = std::move(ranks).take();
      return;
    }
    case value_kind::number: {
      const bool duration = o.unit == "ms";
      const auto n = duration ? parse_milliseconds(v.texts.front()) : parse_unsigned(v.texts.front());
      if (!n || *n < o.min || *n > o.max) {
        bad_value(o, v, v.texts.front(),
                  "expected a whole number from " + std::to_string(o.min) + " to " + std::to_string(o.max) + " (" +
                      std::string(o.unit) + ")" + (duration ? ", or a duration such as 250ms or 1.5s" : "") +
                      (o.why_max.empty() ? "" : ": " + std::string(o.why_max)));
      }
      o.set_number(s, *n);
      return;
    }
    case value_kind::choice: {
      const auto choice = canonical_choice(o.choices, v.texts.front());
      if (!choice) bad_value(o, v, v.texts.front(), "expected " + join(o.choices, ", ", " or "));
      o.set_text(s, *choice);
      return;
    }
    case value_kind::text:
    case value_kind::decimal:
      if (auto why = o.set_text(s, v.texts.front()); !why.empty()) {
        bad_value(o, v, o.shows_value ? v.texts.front() : ledger::redacted_url(v.texts.front()), why);
      }
      return;
    case value_kind::boolean: {
      // The command line's flag has no value: given, it is on.
      const auto on = v.texts.front().empty() ? std::optional<bool>(true) : parse_boolean(v.texts.front());
      if (!on) bad_value(o, v, v.texts.front(), "expected true or false");
      o.set_text(s, *on ? "true" : "false");
      return;
    }
    case value_kind::flag:
      return;
  }
}


}  // namespace dplb::config::detail
