// run(): the I/O shell around workload.hpp (what to send, when) and recorder.hpp (what came back). The only
// file of the load generator that includes Asio and Beast.
//
// Shape: one io_context per thread ("worker"), each with its own connections and idle pool. A dispatcher
// coroutine on worker 0 releases requests at their arrival times, holds the concurrency cap, and spawns
// one coroutine per request on the workers in turn. A request coroutine owns its connection while it
// runs: connect (or take an idle one), write head and body in one gather write, read the head, then read
// the body step by step into a small fixed buffer that the recorder consumes at once.

#include <sys/resource.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <cstdio>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "loadgen.hpp"
#include "recorder.hpp"
#include "workload.hpp"

namespace dplb::loadgen {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;
using error_code = boost::system::error_code;

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// vLLM (uvicorn) closes a connection after 5 s idle. A pooled connection idle longer than this is
// dropped rather than reused, so a request is rarely written into a connection the server is closing;
// still_open() and the one retry in load_run::send cover the rest.
constexpr auto pooled_idle_limit = std::chrono::seconds(4);
// Bytes taken from the parser per step: room for dozens of token events, small enough that thousands
// of concurrent streams cost a few MB.
constexpr std::size_t body_step = 4096;
// Building every body before the clock starts keeps prompt generation out of the latencies; past this
// many bytes they are built as each request starts instead.
constexpr std::size_t prebuilt_bodies_limit = 512u << 20;
// GET /v1/models at start-up, bounded separately from the run.
constexpr auto model_lookup_limit = std::chrono::seconds(30);

// A set-up failure: the run cannot start (bad host, no model). The only exception of this file.
struct setup_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One TCP connection and the bytes read past the last response. Registered with its worker while it
// exists, so the run deadline can close every socket at once.
class connection {
 public:
  connection(asio::io_context& io, std::unordered_set<connection*>& registry)
      : socket(io), registry_(registry) {
    registry_.insert(this);
  }
  ~connection() { registry_.erase(this); }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  tcp::socket socket;
  beast::flat_buffer buffer;
  clock::time_point idle_since{};

 private:
  std::unordered_set<connection*>& registry_;
};

// An idle connection should have nothing to read: end-of-file means the server closed it (its idle
// timeout), stray bytes mean it is out of step. One non-blocking peek spares a request the failed write.
bool still_open(connection& c) {
  if (!c.socket.is_open()) return false;
  char byte = 0;
  const auto got = ::recv(c.socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// One event loop and what belongs to it. Every member is touched only from the loop's own thread.
class worker {
 public:
  worker() : io_(1), deadline_timer_(io_) {}
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  asio::io_context& io() { return io_; }
  bool expired() const { return expired_; }

  std::unique_ptr<connection> open() { return std::make_unique<connection>(io_, open_); }

  // The most recently used idle connection that is not too old and that the server has not closed,
  // or nullptr.
  std::unique_ptr<connection> take_idle() {
    const auto now = clock::now();
    while (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      if (now - c->idle_since < pooled_idle_limit && still_open(*c)) return c;
    }
    return nullptr;
  }

  void give_back(std::unique_ptr<connection> c) {
    if (expired_) return;
    c->idle_since = clock::now();
    idle_.push_back(std::move(c));
  }

  // Closes every socket of this loop when the run's time is up; requests then fail with a timeout.
  asio::awaitable<void> watch_deadline(clock::time_point deadline) {
    deadline_timer_.expires_at(deadline);
    const auto [ec] = co_await deadline_timer_.async_wait(use_tuple);
    if (ec) co_return;  // the run finished first
    expired_ = true;
    idle_.clear();
    for (connection* c : open_) {
      error_code ignored;
      c->socket.close(ignored);
    }
  }

  // Every request is done: lets the loop run out of work.
  void finish() {
    deadline_timer_.cancel();
    idle_.clear();
  }

 private:
  // Declared before io_ so that it outlives it: connections still held by coroutine frames are destroyed
  // with io_ (after a loop was stopped) and unregister themselves here.
  std::unordered_set<connection*> open_;
  asio::io_context io_;
  std::vector<std::unique_ptr<connection>> idle_;  // LIFO: the warmest connection first
  asio::steady_timer deadline_timer_;
  bool expired_ = false;
};

std::string host_header(const std::string& host, std::uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string random_run_id() {
  std::random_device device;
  const std::uint64_t bits = (std::uint64_t{device()} << 32) ^ device() ^
                             static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
  return std::string("bench-") + text;
}

int parse_rank(std::string_view value) {
  int rank = -1;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), rank);
  return ec == std::errc{} && end == value.data() + value.size() ? rank : -1;
}

enum class exchange_outcome {
  reusable,          // the response ended cleanly and the connection may carry another
  finished,          // the result is final; the connection is not reused
  nothing_received,  // no response byte arrived: a pooled connection the server had closed
};

// GET /v1/models, for the model to name when none was given: the first id listed. Runs `io` until the
// answer or `limit`; throws setup_error with the reason otherwise.
std::string first_model_id(asio::io_context& io, const std::vector<tcp::endpoint>& endpoints,
                         const std::string& request, const std::string& what, clock::duration limit) {
  tcp::socket socket(io);
  unsigned status = 0;
  std::string body;
  std::string error = "no answer";
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        const auto [cec, endpoint] = co_await asio::async_connect(socket, endpoints, use_tuple);
        if (cec) {
          error = "connect: " + cec.message();
          co_return;
        }
        const auto [wec, written] = co_await asio::async_write(socket, asio::buffer(request), use_tuple);
        if (wec) {
          error = "write: " + wec.message();
          co_return;
        }
        beast::flat_buffer buffer;
        http::response_parser<http::string_body> parser;
        parser.body_limit(8u << 20);
        const auto [rec, read] = co_await http::async_read(socket, buffer, parser, use_tuple);
        if (rec) {
          error = "read: " + rec.message();
          co_return;
        }
        status = parser.get().result_int();
        body = std::move(parser.get().body());
        error.clear();
      },
      asio::detached);
  io.run_for(limit);
  bool timed_out = false;
  if (!io.stopped()) {
    timed_out = true;
    error_code ignored;
    socket.close(ignored);
    io.run();
  }
  io.restart();
  if (timed_out) {
    throw setup_error(what + ": no answer within " +
                      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()) + " ms");
  }
  if (!error.empty()) throw setup_error(what + ": " + error);
  if (status != 200) throw setup_error(what + ": HTTP " + std::to_string(status));
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (json.is_object() && json.contains("data") && json["data"].is_array() && !json["data"].empty() &&
      json["data"][0].is_object() && json["data"][0].contains("id") && json["data"][0]["id"].is_string()) {
    return json["data"][0]["id"].get<std::string>();
  }
  throw setup_error(what + ": no model id in the answer (pass the model explicitly)");
}
class load_run {
 public:
  load_run(const run_options& options, run_report& report)
      : options_(options), report_(report), workers_(options.threads), progress_timer_(workers_[0].io()),
        slot_freed_(workers_[0].io()) {
    resolve();
    report_.model = options_.shape.model;
    if (report_.model.empty()) {
      const auto target = host_header(options_.host, options_.port);
      const std::string request = "GET /v1/models HTTP/1.1\r\nHost: " + target +
                                  "\r\nUser-Agent: dplb-bench\r\nAccept: application/json\r\n" + extra_headers() +
                                  "Connection: close\r\n\r\n";
      report_.model = first_model_id(workers_[0].io(), endpoints_, request, "GET /v1/models on " + target,
                                     std::min<clock::duration>(model_lookup_limit, options_.timeout));
    }
    prepare_requests();
  }

  void execute() {
    total_ = report_.results.size();
    if (total_ == 0) {
      if (options_.progress) options_.progress(0, 0);
      return;
    }
    start_ = clock::now();
    deadline_ = start_ + options_.timeout;
    for (auto& w : workers_) asio::co_spawn(w.io(), w.watch_deadline(deadline_), asio::detached);
    asio::co_spawn(workers_[0].io(), dispatch(), asio::detached);
    if (options_.progress) asio::co_spawn(workers_[0].io(), report_progress(), asio::detached);

    std::mutex failure_mutex;
    std::exception_ptr failure;
    const auto run_loop = [&](worker& w) {
      try {
        w.io().run();
      } catch (...) {
        // Request coroutines keep their errors as values; anything that escapes is a bug, and the
        // other loops must not wait for requests this one will never finish.
        const std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        for (auto& other : workers_) other.io().stop();
      }
    };
    std::vector<std::thread> threads;
    for (std::size_t i = 1; i < workers_.size(); ++i) threads.emplace_back([&, i] { run_loop(workers_[i]); });
    run_loop(workers_[0]);
    for (auto& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);
    report_.duration_s = std::chrono::duration<double>(end_ - start_).count();
  }

 private:
  void resolve() {
    error_code ec;
    tcp::resolver resolver(workers_[0].io());
    const auto results = resolver.resolve(options_.host, std::to_string(options_.port), ec);
    if (ec || results.empty()) {
      throw setup_error("cannot resolve " + options_.host + ": " + (ec ? ec.message() : "no address"));
    }
    for (const auto& entry : results) endpoints_.push_back(entry.endpoint());
  }

  // Extra headers go on every request, /v1/models included (an API key is one).
  std::string extra_headers() const {
    std::string text;
    for (const auto& [name, value] : options_.shape.extra_headers) text += name + ": " + value + "\r\n";
    return text;
  }

  void prepare_requests() {
    const auto& shape = options_.shape;
    plans_ = plan_requests(shape, report_.results.size(), options_.seed);
    // With sessions the arrival times are the sessions' starts; their later turns follow their answers.
    offsets_ = arrival_offsets(dispatch_units(), options_.request_rate, options_.burstiness, options_.seed,
                               options_.burst_spread.count());
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < plans_.size(); ++i) {
      // A session turn's prompt is its whole history, known only when it is sent (session() sets it).
      report_.results[i].input_words = plans_[i].prompt_words();
      report_.results[i].max_tokens = plans_[i].max_tokens;
      // A session's prefix is its first turn's (the later turns carry it in their history).
      const std::size_t opening = options_.chat_sessions.enabled() ? i - i % options_.chat_sessions.turns : i;
      report_.results[i].prefix_group = plans_[opening].prefix_group;
      bytes += plans_[i].prompt_words() * 6 + 256;
    }
    if (!options_.chat_sessions.enabled() && bytes <= prebuilt_bodies_limit) {
      bodies_.reserve(plans_.size());
      for (const auto& plan : plans_) bodies_.push_back(request_body(shape, report_.model, plan));
    }
    head_prefix_ = "POST " + shape.endpoint + " HTTP/1.1\r\nHost: " + host_header(options_.host, options_.port) +
                   "\r\nUser-Agent: dplb-bench\r\nContent-Type: application/json\r\n" +
                   (options_.keep_alive ? "" : "Connection: close\r\n") + extra_headers() + "x-request-id: ";
    run_id_ = random_run_id();
  }

  // What dispatch() releases at the arrival times under the concurrency cap: requests, or sessions.
  std::size_t dispatch_units() const {
    return options_.chat_sessions.enabled() ? options_.chat_sessions.sessions : report_.results.size();
  }

  // `more_headers`: complete header lines ("Name: value\r\n"), e.g. a session's.
  std::string head_for(std::size_t index, std::size_t body_size, std::string_view more_headers = {}) const {
    std::string head;
    head.reserve(head_prefix_.size() + run_id_.size() + more_headers.size() + 48);
    head.append(head_prefix_).append(run_id_).append("-").append(std::to_string(index)).append("\r\n");
    head.append(more_headers);
    head.append("Content-Length: ").append(std::to_string(body_size)).append("\r\n\r\n");
    return head;
  }

  std::string session_header(std::size_t session) const {
    const auto& name = options_.chat_sessions.header;
    return name.empty() ? std::string{} : name + ": session-" + std::to_string(session) + "\r\n";
  }

  // Releases requests at their arrival times, under the concurrency cap. Waiting here, in order, is
  // what vllm's per-request tasks on a semaphore amount to: request i starts at max(arrival, free slot).
  asio::awaitable<void> dispatch() {
    asio::steady_timer arrival(workers_[0].io());
    const bool sessions = options_.chat_sessions.enabled();
    for (std::size_t i = 0; i < offsets_.size(); ++i) {
      const auto due = start_ + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(offsets_[i]));
      if (due > clock::now()) {
        arrival.expires_at(std::min(due, deadline_));
        co_await arrival.async_wait(use_tuple);
      }
      while (options_.max_concurrency != 0 && in_flight_ >= options_.max_concurrency && clock::now() < deadline_) {
        slot_freed_.expires_at(deadline_);
        co_await slot_freed_.async_wait(use_tuple);
      }
      if (clock::now() >= deadline_) {
        abandon_from(i);
        co_return;
      }
      ++in_flight_;
      auto& w = workers_[i % workers_.size()];
      asio::co_spawn(w.io(), sessions ? session(w, i) : request(w, i), asio::detached);
    }
  }

  // Unit `first` (a request, or a session's first request) and every later one fail unsent.
  void abandon_from(std::size_t first) {
    const std::size_t from = options_.chat_sessions.enabled() ? first * options_.chat_sessions.turns : first;
    for (std::size_t i = from; i < total_; ++i) report_.results[i].error = "not sent: run timeout";
    count_done(total_ - from);
  }

  asio::awaitable<void> request(worker& w, std::size_t index) {
    request_result& result = report_.results[index];
    try {
      const std::string body =
          bodies_.empty() ? request_body(options_.shape, report_.model, plans_[index]) : std::move(bodies_[index]);
      const std::string head = head_for(index, body.size());
      result.start = clock::now();
      co_await send(w, result, head, body);
    } catch (const std::exception& e) {
      result.ok = false;
      result.error = std::string("internal error: ") + e.what();
    }
    release_slot();
    count_done(1);
  }

  // One multi-turn session, its turns one after the other on one worker: each sends the whole
  // conversation so far and waits for its answer, which the next turn sends back. A failed turn ends the
  // session (its later turns fail unsent: the history they would carry does not exist).
  asio::awaitable<void> session(worker& w, std::size_t index) {
    const std::size_t turns = options_.chat_sessions.turns;
    const std::size_t first = index * turns;
    const std::string header = session_header(index);
    conversation talk;
    std::size_t turn = 0;
    for (; turn < turns; ++turn) {
      request_result& result = report_.results[first + turn];
      try {
        talk.add_user_turn(plans_[first + turn]);
        const std::string body = talk.request_body(options_.shape, report_.model, plans_[first + turn].max_tokens);
        result.input_words = talk.words();
        const std::string head = head_for(first + turn, body.size(), header);
        result.start = clock::now();
        co_await send(w, result, head, body);
      } catch (const std::exception& e) {
        result.ok = false;
        result.error = std::string("internal error: ") + e.what();
      }
      count_done(1);
      if (!result.ok) break;
      talk.add_answer(std::move(result.answer));
      result.answer.clear();
    }
    if (turn + 1 < turns) {
      for (std::size_t later = turn + 1; later < turns; ++later) {
        report_.results[first + later].error = "not sent: an earlier turn of its session failed";
      }
      count_done(turns - turn - 1);
    }
    release_slot();
  }

  std::string failure(const char* step, const error_code& ec, const worker& w) const {
    if (w.expired()) return std::string("run timeout while ") + step;
    return std::string(step) + ": " + ec.message();
  }

  asio::awaitable<void> send(worker& w, request_result& result, const std::string& head, const std::string& body) {
    for (int attempt = 0;; ++attempt) {
      // A retry takes a fresh connection: another pooled one may have been closed just the same.
      auto c = options_.keep_alive && attempt == 0 ? w.take_idle() : nullptr;
      const bool reused = c != nullptr;
      if (!c) {
        if (w.expired()) {
          result.error = "run timeout before connecting";
          co_return;
        }
        c = w.open();
        const auto [ec, endpoint] = co_await asio::async_connect(c->socket, endpoints_, use_tuple);
        if (ec || w.expired()) {
          result.error = failure("connecting", ec, w);
          result.e2e_s = std::chrono::duration<double>(clock::now() - result.start).count();
          co_return;
        }
        error_code ignored;
        c->socket.set_option(tcp::no_delay(true), ignored);
      }
      const std::array<asio::const_buffer, 2> bytes{asio::buffer(head), asio::buffer(body)};
      const auto [wec, written] = co_await asio::async_write(c->socket, bytes, use_tuple);
      exchange_outcome outcome = exchange_outcome::nothing_received;
      if (!wec && !w.expired()) outcome = co_await receive(w, *c, result);
      if (outcome == exchange_outcome::reusable) w.give_back(std::move(c));
      if (outcome != exchange_outcome::nothing_received) co_return;
      // Nothing came back on a pooled connection: the server closed it while it sat idle, before it
      // saw this request. One retry on a fresh connection, as HTTP clients do.
      if (reused && attempt == 0 && !w.expired()) {
        result.error.clear();
        continue;
      }
      if (wec || w.expired()) result.error = failure("sending the request", wec, w);
      result.e2e_s = std::chrono::duration<double>(clock::now() - result.start).count();
      co_return;
    }
  }

  asio::awaitable<exchange_outcome> receive(worker& w, connection& c, request_result& result) {
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);  // a long stream is the point; the run deadline bounds it
    const auto [hec, head_bytes] = co_await http::async_read_header(c.socket, c.buffer, parser, use_tuple);
    if (hec || w.expired()) {
      result.error = failure("reading the response head", hec, w);
      result.e2e_s = std::chrono::duration<double>(clock::now() - result.start).count();
      const bool silent = !parser.got_some() && c.buffer.size() == 0 && !w.expired();
      co_return silent ? exchange_outcome::nothing_received : exchange_outcome::finished;
    }
    const auto& head = parser.get();
    result.status = head.result_int();
    if (const auto rank = head.find("x-dplb-rank"); rank != head.end()) {
      result.rank = parse_rank(std::string_view(rank->value().data(), rank->value().size()));
    }
    const auto kind = result.status != 200    ? response_recorder::body_kind::error_text
                      : options_.shape.stream ? response_recorder::body_kind::event_stream
                                              : response_recorder::body_kind::json;
    response_recorder recorder(result, kind, options_.chat_sessions.enabled());
    std::array<char, body_step> step;
    while (!parser.is_done()) {
      parser.get().body().data = step.data();
      parser.get().body().size = step.size();
      auto [ec, read] = co_await http::async_read_some(c.socket, c.buffer, parser, use_tuple);
      if (ec == http::error::need_buffer) ec = {};
      const auto now = clock::now();
      const std::size_t got = step.size() - parser.get().body().size;
      if (got != 0) recorder.consume(std::string_view(step.data(), got), now);
      if (ec || w.expired()) {
        recorder.fail(now, failure("reading the body", ec, w));
        co_return exchange_outcome::finished;
      }
    }
    recorder.complete(clock::now());
    co_return parser.keep_alive() && options_.keep_alive ? exchange_outcome::reusable : exchange_outcome::finished;
  }

  // Called on the unit's worker when a request (or a session) is over, whatever its outcome.
  void release_slot() {
    if (options_.max_concurrency != 0) {
      asio::dispatch(workers_[0].io(), [this] {
        --in_flight_;
        slot_freed_.cancel();
      });
    }
  }

  void count_done(std::size_t n) {
    if (done_.fetch_add(n) + n != total_) return;
    end_ = clock::now();
    for (auto& w : workers_) asio::post(w.io(), [&w] { w.finish(); });
    asio::post(workers_[0].io(), [this] { progress_timer_.cancel(); });
  }

  asio::awaitable<void> report_progress() {
    std::size_t shown = total_ + 1;
    for (;;) {
      const std::size_t done = done_.load();
      if (done != shown) options_.progress(done, total_);
      shown = done;
      if (done == total_) co_return;
      progress_timer_.expires_after(std::chrono::milliseconds(100));
      co_await progress_timer_.async_wait(use_tuple);
    }
  }

  const run_options& options_;
  run_report& report_;
  std::vector<worker> workers_;
  std::vector<tcp::endpoint> endpoints_;
  std::vector<request_plan> plans_;
  std::vector<double> offsets_;       // seconds after start_
  std::vector<std::string> bodies_;   // empty when built per request
  std::string head_prefix_;           // everything of a request head up to the x-request-id value
  std::string run_id_;                // x-request-id is "<run_id_>-<index>": unique across runs
  std::size_t total_ = 0;
  clock::time_point start_{}, deadline_{}, end_{};
  std::atomic<std::size_t> done_{0};
  std::size_t in_flight_ = 0;          // worker 0 only
  asio::steady_timer progress_timer_;  // worker 0
  asio::steady_timer slot_freed_;      // worker 0: cancelled when a request ends under a cap
};

void fail_all(run_report& report, const std::string& why) {
  report.error = why;
  for (auto& r : report.results) {
    r.ok = false;
    if (r.error.empty()) r.error = why;
  }
}

}  // namespace

std::uint64_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<std::uint64_t>(limit.rlim_cur);
}

run_report run(const run_options& options) {
  run_report report;
  report.results.resize(options.num_prompts);
  if (const auto problem = validate(options); !problem.empty()) {
    fail_all(report, "bad options: " + problem);
    return report;
  }
  raise_open_file_limit();
  try {
    load_run load(options, report);
    load.execute();
  } catch (const std::exception& e) {
    fail_all(report, e.what());
  }
  return report;
}

}  // namespace dplb::loadgen
