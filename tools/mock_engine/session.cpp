#include "session.hpp"

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "disconnect_watch.hpp"
#include "dp_routing.hpp"
#include "echo_report.hpp"
#include "faults.hpp"
#include "kv_transfer.hpp"
#include "openai_api.hpp"
#include "sim_engine.hpp"
#include "stream_probe.hpp"

namespace dplb::mock {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using request = http::request<http::string_body>;
using std::chrono::steady_clock;

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

// A completions/chat body, validated: the request, or the error that answers it.
using parsed_generation = std::variant<generation_request, api_error>;

// Limits (the proxy's own are the same, so the mock never hides one of its 413/431 answers).
constexpr std::size_t header_limit = 64 * 1024;
constexpr std::uint64_t body_limit = 64ULL << 20;
// Deadline of each body read and each write once a request has begun: a client that stops reading a
// stream is dropped after this instead of pinning the connection forever.
constexpr auto io_timeout = std::chrono::seconds(60);
// Admin requests are a few bytes of JSON; an idle admin connection is closed after a minute.
constexpr std::uint64_t admin_body_limit = 1ULL << 20;
constexpr auto admin_idle_timeout = std::chrono::seconds(60);
// Before a fault's reset, how long the events already written may take to be acknowledged (so that
// the RST cannot discard them); a peer that stopped reading is reset anyway after this.
constexpr auto reset_drain_limit = std::chrono::seconds(1);
constexpr auto reset_drain_poll = std::chrono::milliseconds(1);

// A decode engine's pull from the prefill engine (POST /internal/kv-pull): connect, send, answer.
constexpr auto kv_pull_timeout = std::chrono::seconds(5);
constexpr std::string_view kv_pull_path = "/internal/kv-pull";
// Without --simulate there is no cache to take blocks from: a prefill holds one synthetic block per 16
// prompt tokens (vLLM's default block size).
constexpr std::uint32_t synthetic_block_size = 16;

constexpr std::string_view mock_rank_header = "x-mock-rank";
constexpr std::string_view mock_engine_header = "x-mock-engine";  // the engine's index on its port
constexpr std::string_view json_type = "application/json";
constexpr std::string_view sse_type = "text/event-stream; charset=utf-8";
constexpr std::string_view metrics_type = "text/plain; version=0.0.4; charset=utf-8";
// FastAPI's bodies for unknown routes and wrong methods.
constexpr std::string_view not_found_body = R"({"detail":"Not Found"})";
constexpr std::string_view method_not_allowed_body = R"({"detail":"Method Not Allowed"})";
constexpr std::string_view continue_response = "HTTP/1.1 100 Continue\r\n\r\n";

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

std::int64_t unix_seconds() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

// X-data-parallel-rank as received, if present.
std::optional<std::string_view> dp_rank_header_of(const request& req) {
  const auto field = req.find(dp_rank_header);
  if (field == req.end()) return std::nullopt;
  return sv(field->value());
}

bool is_read_only(http::verb method) { return method == http::verb::get || method == http::verb::head; }

bool is_generation_path(std::string_view path) {
  return path == "/v1/completions" || path == "/v1/chat/completions";
}

// Appends one HTTP chunk carrying `data` (chunked transfer coding).
void append_chunk(std::string& out, std::string_view data) {
  std::array<char, 16> size{};
  const char* end = std::to_chars(size.data(), size.data() + size.size(), data.size(), 16).ptr;
  out.append(size.data(), static_cast<std::size_t>(end - size.data()))
      .append("\r\n")
      .append(data)
      .append("\r\n");
}

// remote_engine_id of an engine: stable for the process's life, distinct between the process's engines
// (by global index) and between processes on one host (by pid).
std::string kv_engine_id(const engine_state& engine) {
  return "mock-" + std::to_string(::getpid()) + "-" + std::to_string(engine.sim_index);
}

// Frees the holds that are due once `after` has passed (each prefill arms one of these; a hold read
// before then is simply gone when it fires). A timer and its handler, owned by the handler: no coroutine
// whose failure a detached completion would swallow, and expire() only takes the table's lock.
template <class Executor>
void expire_kv_holds_after(const Executor& executor, kv_hold_table& table, std::chrono::milliseconds after) {
  auto timer = std::make_shared<asio::steady_timer>(executor, after);
  timer->async_wait([timer, &table](const boost::system::error_code&) { table.expire(steady_clock::now()); });
}

// What a decode engine's pull got: the blocks, or why not (the message of the client's 400).
using kv_pull_result = std::variant<kv_pulled, std::string>;

// POST /internal/kv-pull to the prefill engine's port, on a fresh connection with one deadline for the
// whole exchange: the mock's stand-in for NIXL reading the remote blocks.
asio::awaitable<kv_pull_result> pull_kv(const kv_transfer_params& params) {
  const auto failed = [&](std::string_view why) {
    return kv_pull_result(std::string("KV transfer of request ") + params.remote_request_id + " from " +
                          params.remote_host + ":" + std::to_string(params.remote_port) + " failed: " +
                          std::string(why));
  };
  const auto executor = co_await asio::this_coro::executor;
  tcp::resolver resolver(executor);
  auto [rec, endpoints] =
      co_await resolver.async_resolve(params.remote_host, std::to_string(params.remote_port), as_result);
  if (rec) co_return failed(rec.message());
  beast::tcp_stream stream(executor);
  stream.expires_after(kv_pull_timeout);
  if (auto [cec, endpoint] = co_await stream.async_connect(endpoints, as_result); cec) co_return failed(cec.message());
  http::request<http::string_body> req{http::verb::post, std::string(kv_pull_path), 11};
  req.set(http::field::host, params.remote_host);
  req.set(http::field::content_type, json_type);
  req.body() = render_kv_pull_request({params.remote_engine_id, params.remote_request_id});
  req.prepare_payload();
  req.keep_alive(false);
  if (auto [wec, n] = co_await http::async_write(stream, req, as_result); wec) co_return failed(wec.message());
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  if (auto [ec, n] = co_await http::async_read(stream, buffer, res, as_result); ec) co_return failed(ec.message());
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (res.result() == http::status::not_found) co_return failed("the prefill engine holds no such blocks");
  if (res.result() != http::status::ok) co_return failed("status " + std::to_string(res.result_int()));
  if (auto pulled = parse_kv_pulled(res.body())) co_return *pulled;
  co_return failed("a malformed answer");
}

class connection final : public closable_connection {
 public:
  connection(tcp::socket socket, const mock_options& options, rank_state& rank, connection_registry& registry)
      : stream_(std::move(socket)),
        timer_(stream_.get_executor()),
        options_(options),
        rank_(rank),
        open_(rank.metrics),
        registration_(registry, *this) {}

  asio::awaitable<void> run();

  // "listening": false. Every pending operation completes with an error and run() ends; whatever was
  // running is then counted as ended by the fault, not as aborted.
  void close_by_fault() override {
    if (closed_by_fault_) return;
    closed_by_fault_ = true;
    rank_.metrics.connections_closed_by_fault.fetch_add(1, std::memory_order_relaxed);
    stream_.close();
    timer_.cancel();
  }

 private:
  asio::awaitable<void> answer_read_error(beast::error_code ec);
  asio::awaitable<void> ignore_until_closed();
  asio::awaitable<void> reset_connection();
  asio::awaitable<bool> serve(request& req);
  engine_wish dp_wish(const request& req) const;
  engine_state& choose_engine(const engine_wish& wish) const;
  engine_state& oracle_engine(std::span<const std::uint64_t> prompt_chain) const;
  parsed_generation parse_generation(const request& req, api_kind kind) const;
  asio::awaitable<bool> serve_routed_generation(const request& req, api_kind kind);
  asio::awaitable<bool> reply(const request& req, http::status status, std::string_view content_type,
                              std::string body, std::string_view allow = {});
  asio::awaitable<bool> serve_generation(const request& req, api_kind kind,
                                         std::optional<parsed_generation> parsed_early);
  asio::awaitable<bool> stream_tokens(const request& req, const generation_request& gen,
                                      const response_renderer& renderer, generation_tracker& tracker);
  asio::awaitable<bool> emit_tokens(const generation_request& gen, const response_renderer& renderer,
                                    generation_tracker& tracker);
  asio::awaitable<bool> answer_at_once(const request& req, const generation_request& gen,
                                       const response_renderer& renderer, generation_tracker& tracker,
                                       bool remote_decode);
  asio::awaitable<bool> serve_simulated(const request& req, generation_request& gen,
                                        const response_renderer& renderer, generation_tracker& tracker,
                                        bool remote_decode, bool remote_prefilled);
  asio::awaitable<bool> reply_holding(const request& req, const generation_request& gen,
                                      const response_renderer& renderer, std::function<void()> on_release = {});
  asio::awaitable<void> release_unpulled(const std::optional<kv_transfer_params>& kv);
  asio::awaitable<void> release_unpulled(const request& req, api_kind kind);
  asio::awaitable<bool> relay_simulated(const sim_stream& state, const generation_request& gen,
                                        const response_renderer& renderer, generation_tracker& tracker);
  asio::awaitable<bool> await_simulated(const sim_stream& state);
  asio::awaitable<bool> wait_for_wake();
  asio::awaitable<bool> send_now_or_later(std::string_view data);
  asio::awaitable<bool> serve_stream_probe(const request& req, std::string_view query);
  asio::awaitable<bool> serve_kv_pull(const request& req);
  kv_transfer_params hold_for_decode(const request& req, const generation_request& gen,
                                     std::function<void()> on_release);
  asio::awaitable<bool> emit_probe_events(const stream_probe_params& params, bool& finished);
  asio::awaitable<bool> sleep_until(steady_clock::time_point deadline);
  asio::awaitable<bool> write_sse_head(const request& req);
  asio::awaitable<bool> write_chunk(std::string_view data, bool last = false);
  asio::awaitable<bool> write_raw(std::string_view data);

  template <class Body>
  void stamp(http::response<Body>& res, const request& req) const {
    res.set(mock_rank_header, rank_.label);
    if (engine_ != nullptr) res.set(mock_engine_header, std::to_string(engine_->index));
    res.keep_alive(req.keep_alive());
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;  // kept across requests: holds pipelined bytes, and its capacity is reused
  asio::steady_timer timer_;   // token and event pacing, fault stalls; with --simulate, the engine's wake-ups
  std::string sim_out_;        // with --simulate: the events of one write, capacity reused
  const mock_options& options_;
  rank_state& rank_;
  engine_state* engine_ = nullptr;  // the engine serving the current request, once chosen
  open_connection open_;
  registration registration_;
  bool closed_by_fault_ = false;  // by close_by_fault()
  bool reset_due_ = false;        // emit_tokens reached reset_after_events: reset instead of the end
  bool reply_failed_ = false;     // the last reply() could not be written (the client went away)
  // --kv-role decode: the pulled blocks' transfer time, added before the current request's first token.
  steady_clock::duration kv_wait_{};
};

asio::awaitable<void> connection::run() {
  for (std::uint64_t number = 1;; ++number) {
    // Checked before and after each head: a new connection is not read at all, a kept-alive one goes
    // silent with the request that arrives while the fault is on.
    if (rank_.faults.accept_but_ignore()) co_return co_await ignore_until_closed();
    http::request_parser<http::string_body> parser;
    parser.header_limit(header_limit);
    parser.body_limit(body_limit);

    // Re-armed for every request: uvicorn's keep-alive idle timeout (it also bounds a new connection's
    // first request and a slow head). Expiry closes the socket and we leave without a word, as uvicorn.
    stream_.expires_after(options_.keepalive_timeout);
    if (const auto [ec, n] = co_await http::async_read_header(stream_, buffer_, parser, as_result); ec) {
      co_await answer_read_error(ec);
      co_return;
    }
    if (rank_.faults.accept_but_ignore()) co_return co_await ignore_until_closed();
    const auto target = sv(parser.get().target());
    const auto path = target.substr(0, target.find('?'));
    if (path != "/metrics") rank_.metrics.requests_received.fetch_add(1, std::memory_order_relaxed);
    else rank_.metrics.metrics_scrapes.fetch_add(1, std::memory_order_relaxed);
    if (path == "/health" && is_read_only(parser.get().method())) {
      rank_.metrics.health_checks.fetch_add(1, std::memory_order_relaxed);
    }
    if (number == options_.close_on_request) {
      // The keep-alive race, staged: the request reached us, no byte of an answer will.
      rank_.metrics.requests_dropped.fetch_add(1, std::memory_order_relaxed);
      stream_.close();
      co_return;
    }
    if (is_generation_path(path) && rank_.faults.reset_on_request()) co_return co_await reset_connection();

    if (!parser.is_done()) {
      // Beast leaves 100-continue to the application; curl waits a second for it before sending.
      if (parser.get().version() >= 11 && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
        if (!co_await write_raw(continue_response)) co_return;
      }
      stream_.expires_after(io_timeout);
      if (const auto [ec, n] = co_await http::async_read(stream_, buffer_, parser, as_result); ec) {
        co_await answer_read_error(ec);
        co_return;
      }
    }

    request req = parser.release();
    if (!co_await serve(req)) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      co_return;
    }
  }
}

asio::awaitable<void> connection::answer_read_error(beast::error_code ec) {
  // Idle timeout, a client gone, or a clean close between requests: nothing to answer.
  if (ec.category() != beast::error_code(http::error::end_of_stream).category() ||
      ec == http::error::end_of_stream || ec == http::error::partial_message) {
    co_return;
  }
  auto status = http::status::bad_request;
  std::string body = R"({"detail":"Invalid HTTP request received."})";
  if (ec == http::error::body_limit) {
    status = http::status::payload_too_large;
    body = R"({"detail":"Request body larger than 64 MiB"})";
  } else if (ec == http::error::header_limit) {
    status = http::status::request_header_fields_too_large;
    body = R"({"detail":"Request head larger than 64 KiB"})";
  }
  http::response<http::string_body> res{status, 11};
  res.set(http::field::content_type, json_type);
  res.set(mock_rank_header, rank_.label);
  res.keep_alive(false);
  res.body() = std::move(body);
  res.prepare_payload();
  stream_.expires_after(io_timeout);
  co_await http::async_write(stream_, res, as_result);
}

// accept_but_ignore: never a byte back, but bytes are read (and dropped) so that the client's close is
// seen and the descriptor freed. Only the client or "listening": false ends this.
asio::awaitable<void> connection::ignore_until_closed() {
  stream_.expires_never();
  std::array<char, 4096> sink;
  for (;;) {
    const auto [ec, n] = co_await stream_.socket().async_read_some(asio::buffer(sink), as_result);
    if (ec) co_return;
  }
}

// The reset faults: SO_LINGER {1, 0} makes close() send RST. Whatever was written before is first
// left to reach the peer (bounded by reset_drain_limit): an RST drops data still queued to send.
asio::awaitable<void> connection::reset_connection() {
  const auto give_up = steady_clock::now() + reset_drain_limit;
  for (;;) {
    int queued = 0;  // bytes not yet acknowledged by the peer
    if (::ioctl(stream_.socket().native_handle(), SIOCOUTQ, &queued) != 0 || queued == 0) break;
    if (steady_clock::now() >= give_up) break;
    if (!co_await sleep_until(steady_clock::now() + reset_drain_poll)) break;
  }
  if (closed_by_fault_) co_return;
  beast::error_code ignored;
  stream_.socket().set_option(asio::socket_base::linger(true, 0), ignored);
  stream_.close();
  rank_.metrics.requests_reset.fetch_add(1, std::memory_order_relaxed);
}

asio::awaitable<bool> connection::serve(request& req) {
  const auto target = sv(req.target());
  const auto query_at = target.find('?');
  const auto path = target.substr(0, query_at);
  const auto query = query_at == std::string_view::npos ? std::string_view{} : target.substr(query_at + 1);
  const auto method = req.method();
  engine_ = nullptr;

  if (is_generation_path(path)) {
    if (method != http::verb::post) {
      co_return co_await reply(req, http::status::method_not_allowed, json_type,
                               std::string(method_not_allowed_body), "POST");
    }
    co_return co_await serve_routed_generation(
        req, path == "/v1/completions" ? api_kind::completions : api_kind::chat);
  }
  if (path == "/tokenize") {
    if (method != http::verb::post) {
      co_return co_await reply(req, http::status::method_not_allowed, json_type,
                               std::string(method_not_allowed_body), "POST");
    }
    auto answer = tokenize_request(sv(req[http::field::content_type]), req.body(), options_.model);
    if (auto* error = std::get_if<api_error>(&answer)) {
      co_return co_await reply(req, static_cast<http::status>(error->status), json_type, std::move(error->body));
    }
    co_return co_await reply(req, http::status::ok, json_type, std::move(std::get<std::string>(answer)));
  }
  if (path == kv_pull_path && options_.role != kv_role::both) {
    if (method != http::verb::post) {
      co_return co_await reply(req, http::status::method_not_allowed, json_type,
                               std::string(method_not_allowed_body), "POST");
    }
    co_return co_await serve_kv_pull(req);
  }
  if (path == "/mock/echo" || path == "/mock/stream") {
    // Engine work of a kind: they go where a generation request would (a refused header is ignored).
    engine_ = &choose_engine(dp_wish(req));
  }
  if (path == "/mock/echo") {
    received_request received{sv(req.method_string()), target, {}, req.body(), req.chunked(), engine_->index,
                              dp_rank_header_of(req)};
    received.headers.reserve(16);
    for (const auto& field : req) received.headers.emplace_back(sv(field.name_string()), sv(field.value()));
    co_return co_await reply(req, http::status::ok, json_type, render_echo_report(received));
  }
  if (path == "/mock/echo-body") {
    co_return co_await reply(req, http::status::ok, "application/octet-stream", std::move(req.body()));
  }
  if (path == "/mock/stream") co_return co_await serve_stream_probe(req, query);
  if (path == "/ping") {
    if (!is_read_only(method) && method != http::verb::post) {
      co_return co_await reply(req, http::status::method_not_allowed, json_type,
                               std::string(method_not_allowed_body), "GET, POST");
    }
    co_return co_await reply(req, http::status::ok, {}, {});
  }

  // The rest are read-only routes; FastAPI answers other methods with 405 and the route's Allow.
  std::string body;
  std::string_view content_type = json_type;
  auto status = http::status::ok;
  if (path == "/health") {
    content_type = {};
    status = static_cast<http::status>(rank_.faults.health_status());
  } else if (path == "/metrics") {
    body = port_metrics_text(rank_, options_.model);
    content_type = metrics_type;
  } else if (path == "/v1/models") {
    body = models_body(options_.model, unix_seconds());
  } else if (path == "/version") {
    body = version_body();
  } else {
    co_return co_await reply(req, http::status::not_found, json_type, std::string(not_found_body));
  }
  if (!is_read_only(method)) {
    co_return co_await reply(req, http::status::method_not_allowed, json_type,
                             std::string(method_not_allowed_body), "GET");
  }
  co_return co_await reply(req, status, content_type, std::move(body));
}

// Sends a complete response (head only for HEAD, with the Content-Length a GET would get).
// Returns whether the connection can serve another request.
asio::awaitable<bool> connection::reply(const request& req, http::status status,
                                        std::string_view content_type, std::string body,
                                        std::string_view allow) {
  http::response<http::string_body> res{status, 11};
  if (!content_type.empty()) res.set(http::field::content_type, content_type);
  if (!allow.empty()) res.set(http::field::allow, allow);
  stamp(res, req);
  res.body() = std::move(body);
  res.prepare_payload();
  stream_.expires_after(io_timeout);
  if (req.method() == http::verb::head) {
    http::response_serializer<http::string_body> serializer{res};
    const auto [ec, n] = co_await http::async_write_header(stream_, serializer, as_result);
    reply_failed_ = static_cast<bool>(ec);
    co_return !ec && res.keep_alive();
  }
  const auto [ec, n] = co_await http::async_write(stream_, res, as_result);
  reply_failed_ = static_cast<bool>(ec);
  co_return !ec && res.keep_alive();
}

// X-data-parallel-rank as the port reads it (dp_routing.hpp).
engine_wish connection::dp_wish(const request& req) const {
  return read_dp_rank_header(dp_rank_header_of(req), static_cast<unsigned>(rank_.engines.size()), rank_.index);
}

// The engine named, or the least busy one (the port's internal LB); a refused value counts as none
// (only completions and chat refuse it, before calling this).
engine_state& connection::choose_engine(const engine_wish& wish) const {
  if (const auto* named = std::get_if<unsigned>(&wish)) return rank_.engines[*named];
  const auto j = least_busy(static_cast<unsigned>(rank_.engines.size()), [this](unsigned e) {
    return rank_.engines[e].metrics.requests_in_flight.load(std::memory_order_relaxed);
  });
  return rank_.engines[j];
}

// --dp-balance oracle: the engine whose KV cache holds the longest prefix of the prompt, within the load
// bound (dp_routing.hpp). The caches are read directly: the oracle runs only with --threads 1, so this
// session runs on thread 0, where the schedulers live; and with no suspension between this choice and
// the caller's in-flight claim, requests that arrive together cannot all choose on the same counts.
engine_state& connection::oracle_engine(std::span<const std::uint64_t> prompt_chain) const {
  std::vector<engine_outlook> engines;
  engines.reserve(rank_.engines.size());
  for (const auto& engine : rank_.engines) {
    engines.push_back({engine.simulation->cached_prefix(engine.sim_index, prompt_chain),
                       engine.metrics.requests_in_flight.load(std::memory_order_relaxed)});
  }
  return rank_.engines[choose_by_cached_prefix(engines, options_.load_bound)];
}

// Simulated engines hash the prompt's blocks for their prefix cache, and keep its tokens when their
// KV-cache events must carry them.
parsed_generation connection::parse_generation(const request& req, api_kind kind) const {
  const std::uint32_t block_size = options_.simulate ? options_.engine.kv.block_size : 0;
  return parse_generation_request(kind, sv(req[http::field::content_type]), req.body(), options_.model,
                                  options_.default_max_tokens, block_size, options_.engine.kv.record_events,
                                  options_.role != kv_role::both);
}

// Completions/chat: X-data-parallel-rank is checked before anything else (a value this port does not
// serve gets vLLM's 400 at once, even for a stream); then the request is the chosen engine's.
asio::awaitable<bool> connection::serve_routed_generation(const request& req, api_kind kind) {
  const auto wish = dp_wish(req);
  const auto header = dp_rank_header_of(req);
  routed_request logged{std::nullopt, header ? std::optional(std::string(*header)) : std::nullopt};
  if (const auto* refusal = std::get_if<std::string>(&wish)) {
    rank_.log(std::move(logged));
    co_return co_await reply(req, http::status::bad_request, json_type,
                             error_body(*refusal, "BadRequestError", 400));
  }
  // The oracle routes by the prompt's block hashes, so it parses the body first; a bad body is still
  // answered where it always is, after the faults (serve_generation), and goes where least-inflight
  // would send it (an empty chain matches nothing).
  std::optional<parsed_generation> parsed_early;
  if (options_.balance == dp_balance::oracle && std::holds_alternative<any_engine>(wish)) {
    parsed_early = parse_generation(req, kind);
    const auto* gen = std::get_if<generation_request>(&*parsed_early);
    engine_ = &oracle_engine(gen != nullptr ? std::span<const std::uint64_t>(gen->prompt_chain.chain())
                                            : std::span<const std::uint64_t>{});
  } else {
    engine_ = &choose_engine(wish);
  }
  logged.engine = engine_->index;
  rank_.log(std::move(logged));
  auto& m = engine_->metrics;
  m.requests_routed.fetch_add(1, std::memory_order_relaxed);
  if (std::holds_alternative<unsigned>(wish)) m.requests_routed_by_header.fetch_add(1, std::memory_order_relaxed);
  const in_flight_claim claim(m);
  co_return co_await serve_generation(req, kind, std::move(parsed_early));
}

// `parsed_early`: the body, if the oracle has parsed it already.
asio::awaitable<bool> connection::serve_generation(const request& req, api_kind kind,
                                                   std::optional<parsed_generation> parsed_early) {
  // The faults that come before any answer, in the order a test would expect: a stall, then a status.
  if (const auto stall = rank_.faults.stall(); stall.count() > 0) {
    if (!co_await unless_disconnected(stream_.socket(), sleep_until(steady_clock::now() + stall))) {
      if (!closed_by_fault_) engine_->metrics.requests_aborted.fetch_add(1, std::memory_order_relaxed);
      co_await release_unpulled(req, kind);
      co_return false;
    }
  }
  if (const auto status = rank_.faults.status(); status != 0) {
    co_await release_unpulled(req, kind);
    co_return co_await reply(req, static_cast<http::status>(status), json_type, injected_error_body(status));
  }

  auto parsed = parsed_early ? std::move(*parsed_early) : parse_generation(req, kind);
  if (auto* error = std::get_if<api_error>(&parsed)) {
    co_return co_await reply(req, static_cast<http::status>(error->status), json_type,
                             std::move(error->body));
  }
  auto& gen = std::get<generation_request>(parsed);
  if (engine_->simulation != nullptr && !engine_->simulation->fits(gen.prompt_tokens, gen.max_tokens)) {
    // vLLM checks against max_model_len, which its KV cache is sized to hold at least once.
    const std::uint64_t capacity =
        std::uint64_t{options_.engine.kv.num_blocks} * options_.engine.kv.block_size;
    co_await release_unpulled(gen.kv_transfer);
    co_return co_await reply(
        req, http::status::bad_request, json_type,
        error_body("This model's maximum context length is " + std::to_string(capacity) +
                       " tokens. However, you requested " +
                       std::to_string(gen.max_tokens > UINT64_MAX - gen.prompt_tokens ? UINT64_MAX
                                                                                       : gen.prompt_tokens + gen.max_tokens) +
                       " tokens (" + std::to_string(gen.prompt_tokens) + " in the messages, " +
                       std::to_string(gen.max_tokens) + " in the completion). Please reduce the length of the "
                       "messages or completion.",
                   "BadRequestError", 400));
  }

  // Disaggregation (--kv-role): a prefill engine keeps a do_remote_decode request's blocks for a decode
  // engine (a streamed answer could not carry kv_transfer_params: it is served as usual); a decode
  // engine first pulls a do_remote_prefill request's blocks, and a pull that fails answers 400.
  // Requests without kv_transfer_params are served whole, as vLLM serves them.
  // With --simulate the transfer time is simulated (divided by --time-scale), and the pulled request skips
  // its prefill in the decode engine's batch.
  kv_wait_ = {};
  const bool remote_decode = options_.role == kv_role::prefill && gen.kv_transfer &&
                             gen.kv_transfer->do_remote_decode && !gen.stream;
  const bool remote_prefilled =
      options_.role == kv_role::decode && gen.kv_transfer && gen.kv_transfer->do_remote_prefill;
  if (remote_prefilled) {
    // Not cancelled by the client's leaving: once sent, the pull completes (bounded), and reading the
    // blocks is what frees them on the prefill engine.
    auto pulled = co_await pull_kv(*gen.kv_transfer);
    if (auto* why = std::get_if<std::string>(&pulled)) {
      engine_->metrics.kv_transfer_errors.fetch_add(1, std::memory_order_relaxed);
      co_return co_await reply(req, http::status::bad_request, json_type, error_body(*why, "BadRequestError", 400));
    }
    engine_->metrics.kv_transfers.fetch_add(1, std::memory_order_relaxed);
    const auto blocks = static_cast<double>(std::get<kv_pulled>(pulled).blocks);
    const double scale = engine_->simulation != nullptr ? options_.time_scale : 1.0;
    kv_wait_ = std::chrono::duration_cast<steady_clock::duration>(std::chrono::duration<double, std::nano>(
        static_cast<double>(options_.kv_transfer_per_block.count()) * blocks / scale));
  }

  const auto request_id = sv(req["x-request-id"]);
  const std::string counted_id =
      request_id.empty() ? std::to_string(rank_.next_request_id.fetch_add(1, std::memory_order_relaxed))
                         : std::string{};
  const response_renderer renderer(kind, request_id.empty() ? counted_id : request_id, unix_seconds(),
                                   options_.model);
  generation_tracker tracker(engine_->metrics, gen.prompt_tokens);
  bool ok = false;
  if (engine_->simulation != nullptr) {
    ok = co_await serve_simulated(req, gen, renderer, tracker, remote_decode, remote_prefilled);
  } else if (gen.stream) {
    ok = co_await stream_tokens(req, gen, renderer, tracker);
  } else {
    ok = co_await answer_at_once(req, gen, renderer, tracker, remote_decode);
  }
  if (reset_due_) {
    tracker.end_by_fault();
    co_await reset_connection();
    co_return false;
  }
  if (closed_by_fault_) tracker.end_by_fault();
  co_return ok&& req.keep_alive();
}

asio::awaitable<bool> connection::stream_tokens(const request& req, const generation_request& gen,
                                                const response_renderer& renderer,
                                                generation_tracker& tracker) {
  // The head goes out at once, as Starlette's StreamingResponse sends it before the first token.
  if (!co_await write_sse_head(req)) co_return false;
  const bool waits = options_.ttft.count() > 0 || kv_wait_.count() > 0 || (options_.itl.count() > 0 && gen.max_tokens > 1);
  if (!waits) co_return co_await emit_tokens(gen, renderer, tracker);
  co_return co_await unless_disconnected(stream_.socket(), emit_tokens(gen, renderer, tracker));
}

asio::awaitable<bool> connection::emit_tokens(const generation_request& gen,
                                              const response_renderer& renderer,
                                              generation_tracker& tracker) {
  // Read when the stream begins: a change of the fault applies from the next stream.
  const auto reset_after = rank_.faults.reset_after_events();
  // Rendered once: every token event of a request is the same bytes.
  const std::string token = renderer.token_event(false);
  const std::string last_token = renderer.token_event(true);
  // An absolute schedule, so that slow writes do not stretch the configured gaps into drift.
  const auto start = steady_clock::now();
  for (std::uint64_t k = 0; k < gen.max_tokens; ++k) {
    if (!co_await sleep_until(start + options_.ttft + kv_wait_ + options_.itl * static_cast<std::int64_t>(k)))
      co_return false;
    if (k == 0 && gen.kind == api_kind::chat) {
      const std::string role = renderer.role_event();
      if (!co_await write_chunk(role)) co_return false;
    }
    const bool last = k + 1 == gen.max_tokens;
    // After min(reset_after, max_tokens) events; the caller resets once the disconnect watch is over.
    const bool reset_now = reset_after != 0 && (k + 1 == reset_after || last);
    tracker.tokens(1);
    if (last && !reset_now) tracker.finish();
    if (!co_await write_chunk(last ? last_token : token)) co_return false;
    if (reset_now) {
      reset_due_ = true;
      co_return false;
    }
  }
  if (gen.include_usage) {
    const std::string usage = renderer.usage_event(gen.prompt_tokens, gen.max_tokens);
    if (!co_await write_chunk(usage)) co_return false;
  }
  co_return co_await write_chunk(done_event, true);
}

// `remote_decode`: a prefill engine's leg 1, whose blocks are held for a decode engine once prefilled.
asio::awaitable<bool> connection::answer_at_once(const request& req, const generation_request& gen,
                                                 const response_renderer& renderer,
                                                 generation_tracker& tracker, bool remote_decode) {
  const auto wait = options_.ttft + kv_wait_ + options_.itl * static_cast<std::int64_t>(gen.max_tokens - 1);
  if (wait.count() > 0 &&
      !co_await unless_disconnected(stream_.socket(), sleep_until(steady_clock::now() + wait)))
    co_return false;
  tracker.tokens(gen.max_tokens);
  tracker.finish();
  if (remote_decode) co_return co_await reply_holding(req, gen, renderer);
  co_return co_await reply(req, http::status::ok, json_type,
                           renderer.full_response(gen.prompt_tokens, gen.max_tokens));
}

// A prefill engine's answer to leg 1: the blocks are held, and the answer says where. An answer that could
// not be written (the router went away) frees them at once: nobody will ever pull them.
// `on_release`: with --simulate, what frees the engine's blocks when the hold goes (sim_request::hand_over_hold).
asio::awaitable<bool> connection::reply_holding(const request& req, const generation_request& gen,
                                                const response_renderer& renderer, std::function<void()> on_release) {
  const auto held = hold_for_decode(req, gen, std::move(on_release));
  const bool ok = co_await reply(req, http::status::ok, json_type,
                                 renderer.full_response(gen.prompt_tokens, gen.max_tokens, &held));
  if (reply_failed_) rank_.kv_holds->take(held.remote_engine_id, held.remote_request_id);
  co_return ok;
}

// A decode request that ends before its pull (a fault's status or stall, a refusal, a client gone during a
// stall) frees its blocks on the prefill engine at once, by reading them and dropping them, instead of
// leaving them held until --kv-hold-timeout-ms: an aborted decode leaves no block held. Not counted as a
// transfer; a failure is ignored (the hold then expires as before).
asio::awaitable<void> connection::release_unpulled(const std::optional<kv_transfer_params>& kv) {
  if (options_.role != kv_role::decode || !kv || !kv->do_remote_prefill) co_return;
  co_await pull_kv(*kv);
}

// The same, from the request's body (read only for this: the faults come before the body is parsed).
asio::awaitable<void> connection::release_unpulled(const request& req, api_kind kind) {
  if (options_.role != kv_role::decode) co_return;
  const auto parsed = parse_generation(req, kind);
  if (const auto* gen = std::get_if<generation_request>(&parsed)) co_await release_unpulled(gen->kv_transfer);
}

// The prefill's blocks go into the process's hold table until a decode engine pulls them or the hold
// timeout frees them; the answer names this engine and the port that served it, where the pull must go.
kv_transfer_params connection::hold_for_decode(const request& req, const generation_request& gen,
                                               std::function<void()> on_release) {
  auto& table = *rank_.kv_holds;
  const auto request_id = sv(req["x-request-id"]);
  // Simulated: the engine's block size (the blocks its cache computed); else vLLM's default.
  const std::uint32_t block_size = options_.simulate ? options_.engine.kv.block_size : synthetic_block_size;
  auto held = table.hold(kv_engine_id(*engine_), request_id.empty() ? std::string_view("prefill") : request_id,
                         blocks_for(gen.prompt_tokens, block_size), gen.prompt_tokens, &engine_->metrics,
                         steady_clock::now(), std::move(on_release));
  beast::error_code ec;
  const auto local = stream_.socket().local_endpoint(ec);
  held.remote_host = ec ? options_.host : local.address().to_string();
  held.remote_port = ec ? 0 : local.port();
  expire_kv_holds_after(stream_.get_executor(), table, table.timeout());
  return held;
}

// POST /internal/kv-pull: a decode engine reads a hold, once. 404 when none matches (never held, read
// already, or expired), in vLLM's error shape.
asio::awaitable<bool> connection::serve_kv_pull(const request& req) {
  auto parsed = parse_kv_pull_request(req.body());
  if (auto* why = std::get_if<std::string>(&parsed)) {
    co_return co_await reply(req, http::status::bad_request, json_type, error_body(*why, "BadRequestError", 400));
  }
  const auto& pull = std::get<kv_pull_request>(parsed);
  const auto pulled = rank_.kv_holds != nullptr ? rank_.kv_holds->take(pull.remote_engine_id, pull.remote_request_id)
                                                : std::nullopt;
  if (!pulled) {
    co_return co_await reply(req, http::status::not_found, json_type,
                             error_body("No KV blocks held for request " + pull.remote_request_id + " of engine " +
                                            pull.remote_engine_id + " (never held, read already, or expired)",
                                        "NotFoundError", 404));
  }
  co_return co_await reply(req, http::status::ok, json_type, render_kv_pulled(*pulled));
}

// --simulate: the rank's engine paces the tokens (sim_engine.hpp). Leaving early, whatever the reason,
// aborts the request in the engine (sim_request's destructor). `remote_decode`: a prefill engine's leg 1,
// answered with the blocks held once its prompt is prefilled (its max_tokens, 1, produced). `remote_prefilled`:
// a decode engine's leg 2 whose blocks were pulled: the transfer's time (kv_wait_, the stream's head already
// sent), then the request joins the batch without its prefill.
asio::awaitable<bool> connection::serve_simulated(const request& req, generation_request& gen,
                                                  const response_renderer& renderer, generation_tracker& tracker,
                                                  bool remote_decode, bool remote_prefilled) {
  if (gen.stream) {
    if (!co_await write_sse_head(req)) co_return false;
    // For send_now_or_later: asio's sockets are non-blocking underneath already, this only makes a
    // synchronous send say would_block instead of waiting.
    if (beast::error_code ec; !stream_.socket().non_blocking()) stream_.socket().non_blocking(true, ec);
  }
  if (kv_wait_.count() > 0 &&
      !co_await unless_disconnected(stream_.socket(), sleep_until(steady_clock::now() + kv_wait_)))
    co_return false;
  sim_request simulated(*engine_->simulation, engine_->sim_index, gen.prompt_tokens, std::move(gen.prompt_chain),
                        gen.max_tokens, gen.stream, timer_, remote_prefilled, remote_decode);
  if (!gen.stream) {
    if (!co_await unless_disconnected(stream_.socket(), await_simulated(simulated.state()))) co_return false;
    tracker.tokens(gen.max_tokens);
    tracker.finish();
    if (remote_decode) co_return co_await reply_holding(req, gen, renderer, simulated.hand_over_hold());
    co_return co_await reply(req, http::status::ok, json_type,
                             renderer.full_response(gen.prompt_tokens, gen.max_tokens));
  }
  co_return co_await unless_disconnected(stream_.socket(),
                                         relay_simulated(simulated.state(), gen, renderer, tracker));
}

// Writes the tokens produced so far after each wake: one event (one chunk) per token as usual, and all
// the events that are ready in one write (several steps' worth when the reader or the loop lagged). The
// same bytes as emit_tokens, the same reset_after_events behaviour; the end (last token, usage, [DONE],
// the terminating chunk) leaves in one write.
asio::awaitable<bool> connection::relay_simulated(const sim_stream& state, const generation_request& gen,
                                                  const response_renderer& renderer,
                                                  generation_tracker& tracker) {
  const auto reset_after = rank_.faults.reset_after_events();  // read when the stream begins
  const auto stop_at = reset_after == 0 ? gen.max_tokens : std::min(reset_after, gen.max_tokens);
  const std::string token = renderer.token_event(false);
  const std::string last_token = renderer.token_event(true);
  std::uint64_t sent = 0;
  for (;;) {
    const auto ready = std::min(state.produced(), stop_at);
    if (ready == sent) {
      if (!co_await wait_for_wake()) co_return false;
      continue;
    }
    sim_out_.clear();
    if (sent == 0 && gen.kind == api_kind::chat) append_chunk(sim_out_, renderer.role_event());
    for (auto k = sent; k < ready; ++k) append_chunk(sim_out_, k + 1 == gen.max_tokens ? last_token : token);
    tracker.tokens(ready - sent);
    sent = ready;
    const bool reset_now = reset_after != 0 && sent == stop_at;
    const bool finished = sent == gen.max_tokens && !reset_now;
    if (finished) {
      tracker.finish();
      if (gen.include_usage) append_chunk(sim_out_, renderer.usage_event(gen.prompt_tokens, gen.max_tokens));
      append_chunk(sim_out_, done_event);
      sim_out_.append("0\r\n\r\n");
    }
    if (!co_await send_now_or_later(sim_out_)) co_return false;
    if (reset_now) {
      reset_due_ = true;
      co_return false;
    }
    if (finished) co_return true;
  }
}

// Written with a local on purpose: GCC 12.2 miscompiles a coroutine without locals that begins with
// `if (!co_await ...) co_return false;` (the first resume reads an uninitialised frame and crashes).
asio::awaitable<bool> connection::await_simulated(const sim_stream& state) {
  bool ok = true;
  while (ok && !state.finished()) ok = co_await wait_for_wake();
  co_return ok;
}

// Each step's events leave with a plain send when the socket buffer takes them, which is nearly always:
// no asynchronous operation, no timer, a fraction of the CPU per token (what lets one core carry a
// thousand simulated streams). A reader that lags gets the rest through write_raw, with its deadline.
asio::awaitable<bool> connection::send_now_or_later(std::string_view data) {
  beast::error_code ec;
  const auto sent = stream_.socket().send(asio::buffer(data.data(), data.size()), 0, ec);
  if (!ec && sent == data.size()) co_return true;
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) co_return false;
  co_return co_await write_raw(data.substr(ec ? 0 : sent));
}

// Parks on timer_ until the engine cancels it (tokens arrived), the client leaves (the disconnect
// watch cancels this coroutine) or a fault closes the connection. A wake that comes while nothing waits
// is lost harmlessly: callers look at the produced count before waiting, on this same thread.
asio::awaitable<bool> connection::wait_for_wake() {
  timer_.expires_at(steady_clock::time_point::max());
  co_await timer_.async_wait(as_result);
  const auto state = co_await asio::this_coro::cancellation_state;
  co_return state.cancelled() == asio::cancellation_type::none && !closed_by_fault_;
}

asio::awaitable<bool> connection::serve_stream_probe(const request& req, std::string_view query) {
  const auto params = parse_stream_probe_query(query);
  if (!params) {
    co_return co_await reply(
        req, http::status::bad_request, json_type,
        R"({"detail":"events, interval_ms and bytes must be integers in [0, 1000000], [0, 60000], [0, 16777216]"})");
  }
  if (!co_await write_sse_head(req)) co_return false;
  if (req.method() == http::verb::head) co_return req.keep_alive();
  bool finished = false;
  bool ok = false;
  if (params->interval.count() > 0 && params->events > 1) {
    ok = co_await unless_disconnected(stream_.socket(), emit_probe_events(*params, finished));
  } else {
    ok = co_await emit_probe_events(*params, finished);
  }
  if (!finished && !closed_by_fault_) engine_->metrics.requests_aborted.fetch_add(1, std::memory_order_relaxed);
  co_return ok&& req.keep_alive();
}

asio::awaitable<bool> connection::emit_probe_events(const stream_probe_params& params, bool& finished) {
  std::string event;
  const auto start = steady_clock::now();
  for (std::uint64_t i = 0; i < params.events; ++i) {
    if (!co_await sleep_until(start + params.interval * static_cast<std::int64_t>(i))) co_return false;
    const auto now =
        std::chrono::duration_cast<std::chrono::microseconds>(steady_clock::now().time_since_epoch());
    render_stream_probe_event(event, i, now.count(), params.bytes);
    if (!co_await write_chunk(event)) co_return false;
  }
  finished = co_await write_chunk(done_event, true);
  co_return finished;
}

asio::awaitable<bool> connection::sleep_until(steady_clock::time_point deadline) {
  if (deadline <= steady_clock::now()) co_return true;
  timer_.expires_at(deadline);
  const auto [ec] = co_await timer_.async_wait(as_result);
  co_return !ec;
}

// The head of a chunked event stream. The same response and serializer types as reply() uses for HEAD,
// so that Beast's write machinery is instantiated once less.
asio::awaitable<bool> connection::write_sse_head(const request& req) {
  http::response<http::string_body> res{http::status::ok, 11};
  res.set(http::field::content_type, sse_type);
  stamp(res, req);
  res.chunked(true);
  http::response_serializer<http::string_body> serializer{res};
  stream_.expires_after(io_timeout);
  const auto [ec, n] = co_await http::async_write_header(stream_, serializer, as_result);
  co_return !ec;
}

// One SSE event = one HTTP chunk = one write, sent at once: what a relay's per-event latency is measured
// on. `last` appends the terminating chunk to the same write. The framing is written here rather than
// with http::make_chunk so that every raw write shares one buffer-sequence type (one instantiation of
// the write machinery instead of three).
asio::awaitable<bool> connection::write_chunk(std::string_view data, bool last) {
  std::array<char, 20> size_line{};
  char* end = std::to_chars(size_line.data(), size_line.data() + size_line.size() - 2, data.size(), 16).ptr;
  *end++ = '\r';
  *end++ = '\n';
  constexpr std::string_view crlf = "\r\n";
  constexpr std::string_view crlf_and_last_chunk = "\r\n0\r\n\r\n";
  const std::array<asio::const_buffer, 3> buffers{
      asio::buffer(size_line.data(), static_cast<std::size_t>(end - size_line.data())),
      asio::buffer(data.data(), data.size()), asio::buffer(last ? crlf_and_last_chunk : crlf)};
  stream_.expires_after(io_timeout);
  const auto [ec, n] = co_await asio::async_write(stream_, buffers, as_result);
  co_return !ec;
}

// Bytes outside any message framing (the interim 100 Continue).
asio::awaitable<bool> connection::write_raw(std::string_view data) {
  const std::array<asio::const_buffer, 3> buffers{asio::buffer(data.data(), data.size())};
  stream_.expires_after(io_timeout);
  const auto [ec, n] = co_await asio::async_write(stream_, buffers, as_result);
  co_return !ec;
}

}  // namespace

asio::awaitable<void> serve_connection(tcp::socket socket, const mock_options& options, rank_state& rank,
                                       connection_registry& registry) {
  connection conn(std::move(socket), options, rank, registry);
  co_await conn.run();
}

asio::awaitable<void> serve_admin_connection(tcp::socket socket, admin_handler& admin) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(header_limit);
    parser.body_limit(admin_body_limit);
    stream.expires_after(admin_idle_timeout);
    if (const auto [ec, n] = co_await http::async_read(stream, buffer, parser, as_result); ec) co_return;
    const request req = parser.release();
    auto answer = co_await admin.handle(sv(req.method_string()), sv(req.target()), req.body());

    http::response<http::string_body> res{static_cast<http::status>(answer.status), 11};
    res.set(http::field::content_type, answer.content_type);
    res.keep_alive(req.keep_alive());
    res.body() = std::move(answer.body);
    res.prepare_payload();
    stream.expires_after(io_timeout);
    if (const auto [ec, n] = co_await http::async_write(stream, res, as_result); ec || !res.keep_alive()) {
      beast::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
      co_return;
    }
  }
}

}  // namespace dplb::mock
