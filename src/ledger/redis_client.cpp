#include "dplb/ledger/redis_client.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>

namespace dplb::ledger {

namespace asio = boost::asio;
using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

namespace {

redis_reply copy_reply(const redisReply* r) {
  redis_reply out;
  switch (r->type) {
    case REDIS_REPLY_INTEGER:
      out.type = redis_reply::kind::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out.type = r->type == REDIS_REPLY_STRING   ? redis_reply::kind::string
                 : r->type == REDIS_REPLY_STATUS ? redis_reply::kind::status
                                                 : redis_reply::kind::error;
      out.text.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = redis_reply::kind::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(copy_reply(r->element[i]));
      break;
    default:
      break;
  }
  return out;
}

}  // namespace

// One hiredis context and the descriptor Asio waits on for it. hiredis owns the socket: it closes it when
// it frees the context, and tells us first through the cleanup hook, where the descriptor lets go of it.
struct connection : std::enable_shared_from_this<connection> {
  explicit connection(asio::io_context& io) : socket(io) {}

  redisAsyncContext* ac = nullptr;  // null once hiredis freed it
  asio::posix::stream_descriptor socket;
  bool want_read = false, want_write = false;  // what hiredis asked for
  bool reading = false, writing = false;       // a wait is pending
  std::function<void()> gone;                  // posted once, when hiredis freed the context

  void wait(bool for_read) {
    bool& pending = for_read ? reading : writing;
    if (pending || !ac) return;
    pending = true;
    socket.async_wait(for_read ? asio::posix::stream_descriptor::wait_read : asio::posix::stream_descriptor::wait_write,
                      [self = shared_from_this(), for_read](const boost::system::error_code& ec) {
                        (for_read ? self->reading : self->writing) = false;
                        if (ec || !self->ac) return;
                        if (for_read && self->want_read) redisAsyncHandleRead(self->ac);
                        else if (!for_read && self->want_write) redisAsyncHandleWrite(self->ac);
                      });
  }

  // hiredis's event hooks: idempotent, as it asks. A wait that is no longer wanted is let run out.
  static void add_read(void* p) { auto* c = static_cast<connection*>(p); c->want_read = true; c->wait(true); }
  static void del_read(void* p) { static_cast<connection*>(p)->want_read = false; }
  static void add_write(void* p) { auto* c = static_cast<connection*>(p); c->want_write = true; c->wait(false); }
  static void del_write(void* p) { static_cast<connection*>(p)->want_write = false; }
  static void cleanup(void* p) {
    auto* c = static_cast<connection*>(p);
    c->ac = nullptr;
    boost::system::error_code ignored;
    c->socket.cancel(ignored);
    (void)c->socket.release();  // hiredis closes the fd itself
    if (c->gone) asio::post(c->socket.get_executor(), std::exchange(c->gone, {}));
  }
};

struct redis_client::impl : std::enable_shared_from_this<impl> {
  impl(asio::io_context& io, redis_client_options o)
      : io(io), options(std::move(o)), connect_deadline(io), command_deadline(io), backoff_timer(io),
        resolver(io), backoff(options.backoff_min) {}

  // A command waiting for its reply; hiredis carries its id as the callback's private data.
  struct pending {
    std::string op;
    result_handler done;
    steady::time_point deadline;
    bool internal = false;  // part of the connect's pipeline
  };

  asio::io_context& io;
  const redis_client_options options;
  std::shared_ptr<connection> conn;  // the current context (its ac null between connects)
  std::atomic<bool> is_up{false};
  bool closing = false;
  bool connect_failed = false;  // this attempt's failure was reported
  bool down_logged = false;     // the failure to connect was logged since the last success
  bool started = false;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, pending> waiting;  // by id: in the order sent, so deadlines ascend among the caller's
  std::size_t pipeline_left = 0;             // the connect's commands not yet answered
  asio::steady_timer connect_deadline, command_deadline, backoff_timer;
  bool command_deadline_armed = false;
  asio::ip::tcp::resolver resolver;
  milliseconds backoff;
  std::function<void()> connected, disconnected;
  std::function<void(std::string_view)> message;
  std::function<void(std::string_view, std::string_view)> error;

  static constexpr std::uint64_t subscription_id = 0;  // SUBSCRIBE's callback: hiredis keeps it per channel

  // Posted like every other callback: a failure is often noticed inside hiredis.
  void report(std::string_view op, std::string_view why) {
    if (!error) return;
    asio::post(io, [self = weak_from_this(), op = std::string(op), why = std::string(why)] {
      if (auto s = self.lock(); s && !s->closing && s->error) s->error(op, why);
    });
  }

  void finish(std::uint64_t id, redis_result result) {
    auto it = waiting.find(id);
    if (it == waiting.end()) return;  // already timed out: a late reply is dropped
    auto p = std::move(it->second);
    waiting.erase(it);
    if (p.internal) {
      on_pipeline_reply(result);
      return;
    }
    if (!result.ok) report(p.op, result.error);
    asio::post(io, [done = std::move(p.done), result = std::move(result)] { done(result); });
  }

  // A connect attempt failed: said once (one error counted, one line logged until the next success), and
  // its context dropped.
  void fail_connect(std::string_view why) {
    if (!connect_failed) {
      connect_failed = true;
      report("connect", why);
      if (!down_logged) {
        down_logged = true;
        spdlog::warn("{}: no ledger at Redis {}:{} ({}): serving by this replica's own counts until it answers",
                     options.name, options.endpoint.host, options.endpoint.port, why);
      }
    }
    break_connection();
  }

  // hiredis's reply callback (also called with no reply for every command still waiting when it frees the
  // context).
  static void on_reply(redisAsyncContext* ac, void* r, void* privdata) {
    auto* self = static_cast<impl*>(ac->data);
    const auto id = reinterpret_cast<std::uintptr_t>(privdata);
    const auto* reply = static_cast<const redisReply*>(r);
    if (id == subscription_id) {
      self->on_subscription(reply);
      return;
    }
    redis_result result;
    if (!reply) {
      result.error = ac->err && ac->errstr ? std::string("connection lost: ") + ac->errstr : "connection lost";
    } else {
      result.reply = copy_reply(reply);
      result.ok = reply->type != REDIS_REPLY_ERROR;
      if (!result.ok) result.error = result.reply.text;
    }
    self->finish(id, std::move(result));
  }

  void on_subscription(const redisReply* reply) {
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3) return;
    const std::string_view kind(reply->element[0]->str ? reply->element[0]->str : "", reply->element[0]->len);
    if (kind == "subscribe") {
      redis_result ok;
      ok.ok = true;
      on_pipeline_reply(ok);
    } else if (kind == "message" && reply->element[2]->type == REDIS_REPLY_STRING && message) {
      asio::post(io, [self = weak_from_this(), text = std::string(reply->element[2]->str, reply->element[2]->len)] {
        if (auto s = self.lock(); s && !s->closing && s->message) s->message(text);
      });
    }
  }

  void on_pipeline_reply(const redis_result& result) {
    if (!result.ok) {
      fail_connect(result.error);
      return;
    }
    if (pipeline_left == 0 || --pipeline_left > 0) return;
    // Up once this posted step runs: nothing of the caller's can be sent on this connection before
    // on_connected (a re-registration) is.
    asio::post(io, [self = weak_from_this(), c = conn] {
      auto s = self.lock();
      if (!s || s->closing || s->conn != c || !c->ac) return;
      s->connect_deadline.cancel();
      s->backoff = s->options.backoff_min;
      s->is_up = true;
      s->down_logged = false;
      spdlog::info("{}: connected to Redis at {}:{}", s->options.name, s->options.endpoint.host, s->options.endpoint.port);
      if (s->connected) s->connected();
    });
  }

  bool send(std::uint64_t id, const std::vector<std::string>& argv) {
    std::vector<const char*> args;
    std::vector<std::size_t> lengths;
    args.reserve(argv.size());
    lengths.reserve(argv.size());
    for (const auto& a : argv) {
      args.push_back(a.data());
      lengths.push_back(a.size());
    }
    return redisAsyncCommandArgv(conn->ac, &impl::on_reply, reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)),
                                 static_cast<int>(argv.size()), args.data(), lengths.data()) == REDIS_OK;
  }

  void start() {
    if (started) return;
    started = true;
    connect();
  }

  void connect() {
    if (closing) return;
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(options.endpoint.host, ec);
    if (!ec) {
      connect_to(address.to_string());
      return;
    }
    // A host name is resolved by Asio, not by hiredis's blocking getaddrinfo.
    resolver.async_resolve(options.endpoint.host, std::to_string(options.endpoint.port),
                           [self = weak_from_this()](const boost::system::error_code& ec,
                                                     const asio::ip::tcp::resolver::results_type& results) {
                             auto s = self.lock();
                             if (!s || s->closing) return;
                             if (ec || results.empty()) {
                               s->connect_failed = false;
                               s->fail_connect("cannot resolve the host: " + ec.message());
                               s->retry_later();
                               return;
                             }
                             s->connect_to(results.begin()->endpoint().address().to_string());
                           });
  }

  void connect_to(const std::string& ip) {
    connect_failed = false;
    redisAsyncContext* ac = redisAsyncConnect(ip.c_str(), options.endpoint.port);
    if (!ac || ac->err) {
      fail_connect(ac ? ac->errstr : "out of memory");
      if (ac) redisAsyncFree(ac);
      retry_later();
      return;
    }
    conn = std::make_shared<connection>(io);
    boost::system::error_code ec;
    conn->socket.assign(ac->c.fd, ec);
    if (ec) {
      fail_connect(ec.message());
      redisAsyncFree(ac);
      retry_later();
      return;
    }
    conn->ac = ac;
    conn->gone = [self = weak_from_this(), c = conn] {
      if (auto s = self.lock()) s->on_gone(c);
    };
    ac->data = this;
    ac->ev.data = conn.get();
    ac->ev.addRead = &connection::add_read;
    ac->ev.delRead = &connection::del_read;
    ac->ev.addWrite = &connection::add_write;
    ac->ev.delWrite = &connection::del_write;
    ac->ev.cleanup = &connection::cleanup;
    // Waits for the first write event, which says the connect completed (or failed: then hiredis frees
    // the context, and the cleanup hook tells us).
    redisAsyncSetConnectCallback(ac, [](const redisAsyncContext*, int) {});

    connect_deadline.expires_after(options.connect_timeout);
    connect_deadline.async_wait([self = weak_from_this(), c = conn](const boost::system::error_code& ec) {
      auto s = self.lock();
      if (ec || !s || s->conn != c || !c->ac || s->is_up) return;
      s->fail_connect("no answer within the connect timeout");
    });

    std::vector<std::vector<std::string>> pipeline;
    const auto& e = options.endpoint;
    if (!e.password.empty()) {
      pipeline.push_back(e.user.empty() ? std::vector<std::string>{"AUTH", e.password}
                                        : std::vector<std::string>{"AUTH", e.user, e.password});
    }
    if (e.db != 0 && options.subscribe_channel.empty()) pipeline.push_back({"SELECT", std::to_string(e.db)});
    if (!options.function_library.empty()) pipeline.push_back({"FUNCTION", "LOAD", "REPLACE", options.function_library});
    // Up means answered: a connection with nothing else to send proves itself with a PING.
    if (pipeline.empty() && options.subscribe_channel.empty()) pipeline.push_back({"PING"});
    pipeline_left = pipeline.size() + (options.subscribe_channel.empty() ? 0 : 1);
    const auto deadline = steady::now() + options.connect_timeout;
    for (const auto& argv : pipeline) {
      const auto id = next_id++;
      waiting.emplace(id, pending{"connect", {}, deadline, true});
      send(id, argv);
    }
    if (!options.subscribe_channel.empty()) {
      const char* argv[] = {"SUBSCRIBE", options.subscribe_channel.c_str()};
      const std::size_t lengths[] = {9, options.subscribe_channel.size()};
      redisAsyncCommandArgv(ac, &impl::on_reply, reinterpret_cast<void*>(subscription_id), 2, argv, lengths);
    }
  }

  // hiredis freed the context (an error, the peer's close, or ours): every command still waiting fails,
  // and a new connect follows the backoff.
  void on_gone(const std::shared_ptr<connection>& c) {
    if (conn != c) return;
    const bool was_up = is_up.exchange(false);
    connect_deadline.cancel();
    for (auto it = waiting.begin(); it != waiting.end();) {
      auto id = it++->first;
      finish(id, redis_result{false, {}, "connection lost"});
    }
    if (closing) return;
    if (was_up) {
      spdlog::warn("{}: lost the connection to Redis at {}:{}", options.name, options.endpoint.host,
                   options.endpoint.port);
      if (disconnected) disconnected();
    }
    retry_later();
  }

  void retry_later() {
    if (closing) return;
    backoff_timer.expires_after(backoff);
    backoff = std::min(backoff * 2, options.backoff_max);
    backoff_timer.async_wait([self = weak_from_this()](const boost::system::error_code& ec) {
      if (auto s = self.lock(); s && !ec) s->connect();
    });
  }

  // Drops the current context (never from inside hiredis: from a timer or a posted step). hiredis calls
  // back every waiting command with no reply, then the cleanup hook.
  void break_connection() {
    if (!conn || !conn->ac) return;
    redisAsyncContext* ac = conn->ac;
    asio::post(io, [self = weak_from_this(), c = conn, ac] {
      auto s = self.lock();
      if (s && c->ac == ac) redisAsyncFree(ac);
    });
  }

  void command(std::string_view op, const std::vector<std::string>& argv, result_handler done) {
    if (!is_up || !conn || !conn->ac) {
      std::string why = "not connected";
      report(op, why);
      asio::post(io, [done = std::move(done), why = std::move(why)] { done(redis_result{false, {}, why}); });
      return;
    }
    const auto id = next_id++;
    waiting.emplace(id, pending{std::string(op), std::move(done), steady::now() + options.timeout, false});
    if (!send(id, argv)) {
      finish(id, redis_result{false, {}, "hiredis refused the command"});
      return;
    }
    arm_command_deadline();
  }

  // One timer for every command: the caller's are sent in order with one timeout, so the oldest waiting
  // has the nearest deadline.
  void arm_command_deadline() {
    if (command_deadline_armed || waiting.empty()) return;
    command_deadline_armed = true;
    command_deadline.expires_at(waiting.begin()->second.deadline);
    command_deadline.async_wait([self = weak_from_this()](const boost::system::error_code&) {
      auto s = self.lock();
      if (!s || s->closing) return;
      s->command_deadline_armed = false;
      s->on_command_deadline();
    });
  }

  void on_command_deadline() {
    const auto now = steady::now();
    bool expired = false;
    for (auto it = waiting.begin(); it != waiting.end() && it->second.deadline <= now;) {
      if (it->second.internal) {
        ++it;  // the connect deadline covers the pipeline
        continue;
      }
      expired = true;
      auto id = it++->first;
      finish(id, redis_result{false, {}, "no answer within " + std::to_string(options.timeout.count()) + " ms"});
    }
    // hiredis cannot forget one command: the connection is dropped, so that no late reply is taken for a
    // later command's.
    if (expired) break_connection();
    arm_command_deadline();
  }

  void close() {
    closing = true;
    is_up = false;
    waiting.clear();
    connect_deadline.cancel();
    command_deadline.cancel();
    backoff_timer.cancel();
    resolver.cancel();
    if (conn && conn->ac) redisAsyncFree(conn->ac);
  }
};

redis_client::redis_client(asio::io_context& io, redis_client_options options)
    : impl_(std::make_shared<impl>(io, std::move(options))) {}

redis_client::~redis_client() { impl_->close(); }

void redis_client::on_connected(std::function<void()> f) { impl_->connected = std::move(f); }
void redis_client::on_disconnected(std::function<void()> f) { impl_->disconnected = std::move(f); }
void redis_client::on_message(std::function<void(std::string_view)> f) { impl_->message = std::move(f); }
void redis_client::on_error(std::function<void(std::string_view, std::string_view)> f) {
  impl_->error = std::move(f);
}
void redis_client::start() { impl_->start(); }
void redis_client::command(std::string_view op, const std::vector<std::string>& argv, result_handler done) {
  impl_->command(op, argv, std::move(done));
}
bool redis_client::up() const noexcept { return impl_->is_up; }

}  // namespace dplb::ledger
