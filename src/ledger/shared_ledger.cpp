#include "dplb/ledger/shared_ledger.hpp"

#include "dplb/ledger/ledger_functions.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <charconv>
#include <cstdio>

namespace dplb::ledger {

namespace asio = boost::asio;

std::string_view ledger_op_name(ledger_op op) {
  switch (op) {
    case ledger_op::connect: return "connect";
    case ledger_op::pick: return "pick";
    case ledger_op::release: return "release";
    case ledger_op::register_: return "register";
    case ledger_op::view: return "view";
    case ledger_op::bucket: return "bucket";
    case ledger_op::count: break;
  }
  return "unknown";
}

namespace {

redis_client_options client_options(const ledger_options& o) {
  redis_client_options c;
  c.endpoint = o.endpoint;
  c.timeout = o.timeout;
  c.connect_timeout = o.connect_timeout;
  c.backoff_min = o.backoff_min;
  c.backoff_max = o.backoff_max;
  return c;
}

std::string prefix_of(const ledger_options& o) { return "{dplb:" + o.ns + "}"; }

// A double as a function argument, every digit kept (Lua's tonumber reads it back exactly).
std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

template <class Number>
std::optional<Number> number_of(const redis_reply& r) {
  if (r.type == redis_reply::kind::integer) return static_cast<Number>(r.integer);
  Number n{};
  const auto* end = r.text.data() + r.text.size();
  if (r.type != redis_reply::kind::string || std::from_chars(r.text.data(), end, n).ptr != end) return std::nullopt;
  return n;
}

}  // namespace

struct shared_ledger::impl : std::enable_shared_from_this<impl> {
  impl(asio::io_context& io, ledger_options o, in_flight_fn in_flight, freed_fn on_freed)
      : options(std::move(o)), in_flight(std::move(in_flight)), on_freed(std::move(on_freed)),
        commands(io, [&] {
          auto c = client_options(options);
          c.function_library = std::string(ledger_function_library);
          return c;
        }()),
        freed(io, [&] {
          auto c = client_options(options);
          c.subscribe_channel = prefix_of(options) + ":freed";
          c.name = "shared state (freed slots)";
          return c;
        }()),
        renew_timer(io) {
    const auto prefix = prefix_of(options);
    keys = {"4", prefix + ":replicas", prefix + ":total", prefix + ":rr", prefix + ":r:" + options.replica};
    lease_ms = std::to_string(options.lease.count());
  }

  const ledger_options options;
  in_flight_fn in_flight;
  freed_fn on_freed;
  redis_client commands;  // FCALLs
  redis_client freed;     // subscribed to `{..}:freed`: a connection in subscriber mode sends nothing else
  asio::steady_timer renew_timer;
  std::vector<std::string> keys;  // FCALL's numkeys and keys, the same for every function
  std::string lease_ms;
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(ledger_op::count)> errors{};
  std::size_t picks_waiting = 0;  // picks sent whose answer the caller has not had yet
  bool register_due = false;      // a registration waits for them

  void count_error(std::string_view op) {
    for (std::size_t i = 0; i < errors.size(); ++i) {
      if (ledger_op_name(static_cast<ledger_op>(i)) == op) errors[i].fetch_add(1, std::memory_order_relaxed);
    }
  }

  std::vector<std::string> fcall(std::string_view function) const {
    std::vector<std::string> argv{"FCALL", std::string(function)};
    argv.insert(argv.end(), keys.begin(), keys.end());
    argv.push_back(options.replica);
    argv.push_back(lease_ms);
    return argv;
  }

  void start() {
    std::weak_ptr<impl> weak = weak_from_this();
    commands.on_error([weak](std::string_view op, std::string_view) {
      if (auto s = weak.lock()) s->count_error(op);
    });
    freed.on_error([weak](std::string_view op, std::string_view) {
      if (auto s = weak.lock()) s->count_error(op);
    });
    // First on every new connection, before any pick: the counts this replica holds now, a server
    // restarted empty included.
    commands.on_connected([weak] {
      if (auto s = weak.lock()) s->send_registration();
    });
    freed.on_message([weak](std::string_view text) {
      auto s = weak.lock();
      std::size_t rank = 0;
      const auto* end = text.data() + text.size();
      if (s && s->on_freed && std::from_chars(text.data(), end, rank).ptr == end) s->on_freed(rank);
    });
    commands.start();
    freed.start();
    arm_renewal();
  }

  void arm_renewal() {
    renew_timer.expires_after(options.renew_every);
    renew_timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto s = weak.lock();
      if (!s || ec) return;
      if (s->commands.up()) s->register_when_settled();
      s->arm_renewal();
    });
  }

  // A pick waiting for its answer may already be recorded in Redis but not yet in the caller's counts:
  // registering now would take it out again. So the registration waits until no pick is waiting.
  void register_when_settled() {
    if (picks_waiting > 0) {
      register_due = true;
      return;
    }
    send_registration();
  }

  void send_registration() {
    register_due = false;
    auto argv = fcall("dplb_register_3");
    if (in_flight) {
      for (const auto& [rank, load] : in_flight()) {
        const auto r = std::to_string(rank);
        for (const auto& [name, n] : {std::pair{r, std::uint64_t{load.requests}}, std::pair{r + ":p", load.prompt_tokens},
                                      std::pair{r + ":c", load.cost_tokens}}) {
          if (n == 0) continue;
          argv.push_back(name);
          argv.push_back(std::to_string(n));
        }
      }
    }
    commands.command("register", argv, [](const redis_result&) {});
  }

  void pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
            request_tokens tokens, std::size_t group, std::function<void(const ledger_pick&)> done) {
    auto argv = fcall("dplb_pick_3");
    argv.push_back(policy == ledger_policy::round_robin    ? "round-robin"
                   : policy == ledger_policy::least_tokens ? "least-tokens"
                   : policy == ledger_policy::least_load   ? "least-load"
                                                           : "least-inflight");
    argv.push_back(std::to_string(limit));
    argv.push_back(std::to_string(tokens.prompt));
    argv.push_back(std::to_string(tokens.decode));
    argv.push_back(number(options.least_tokens.request_band));
    argv.push_back(number(options.least_tokens.slot_tokens));
    argv.push_back(number(options.least_tokens.decode_share));
    argv.push_back(std::to_string(group));
    for (const auto& c : candidates) {
      argv.push_back(std::to_string(c.rank));
      argv.push_back(number(c.weight));
      argv.push_back(number(c.floor));
    }
    ++picks_waiting;
    commands.command("pick", argv, [weak = weak_from_this(), done = std::move(done)](const redis_result& r) {
      auto s = weak.lock();
      if (s) --s->picks_waiting;  // first: should `done` throw, later registrations are not held back for good
      done(read_pick(r));  // the caller counts the pick here: before any registration below
      if (s && s->register_due && s->picks_waiting == 0 && s->commands.up()) s->send_registration();
    });
  }

  static ledger_pick read_pick(const redis_result& r) {
    ledger_pick out;
    if (!r.ok) {
      out.error = r.error;
      return out;
    }
    const auto& e = r.reply.elements;
    const auto rank = e.size() >= 2 ? number_of<long long>(e[0]) : std::nullopt;
    const auto replicas = e.size() >= 2 ? number_of<std::uint32_t>(e[1]) : std::nullopt;
    if (!rank || !replicas) {
      out.error = "unexpected answer to dplb_pick_3";
      return out;
    }
    out.ok = true;
    if (*rank >= 0) out.rank = static_cast<std::size_t>(*rank);
    out.replicas = *replicas;
    for (std::size_t i = 2; i < e.size(); ++i) out.counts.push_back(number_of<std::uint32_t>(e[i]).value_or(0));
    return out;
  }

  void release(std::size_t rank, std::uint64_t prompt_left, std::uint64_t cost) {
    auto argv = fcall("dplb_release_3");
    argv.push_back(std::to_string(rank));
    argv.push_back(std::to_string(prompt_left));
    argv.push_back(std::to_string(cost));
    commands.command("release", argv, [](const redis_result&) {});
  }

  void prompt_done(std::size_t rank, std::uint64_t prompt) {
    auto argv = fcall("dplb_prompt_done_3");
    argv.push_back(std::to_string(rank));
    argv.push_back(std::to_string(prompt));
    commands.command("release", argv, [](const redis_result&) {});
  }

  void view(std::function<void(const ledger_view&)> done) {
    commands.command("view", fcall("dplb_view_3"), [done = std::move(done)](const redis_result& r) {
      ledger_view v;
      v.error = r.error;
      const auto& e = r.reply.elements;
      if (r.ok && !e.empty()) {
        v.ok = true;
        v.replicas = number_of<std::uint32_t>(e[0]).value_or(0);
        for (std::size_t i = 1; i + 1 < e.size(); i += 2) {
          // '<rank>' (requests), '<rank>:p' (prompt tokens), '<rank>:c' (cost tokens).
          const std::string_view name = e[i].text;
          const auto colon = name.find(':');
          std::size_t rank = 0;
          const auto digits = name.substr(0, colon);
          if (std::from_chars(digits.data(), digits.data() + digits.size(), rank).ptr != digits.data() + digits.size()) {
            continue;
          }
          const auto n = number_of<std::uint64_t>(e[i + 1]).value_or(0);
          auto& load = v.load[rank];
          if (colon == std::string_view::npos) {
            load.requests = static_cast<std::uint32_t>(n);
            v.total[rank] = load.requests;
          } else if (name.substr(colon + 1) == "p") {
            load.prompt_tokens = n;
          } else if (name.substr(colon + 1) == "c") {
            load.cost_tokens = n;
          }
        }
      } else if (r.ok) {
        v.error = "unexpected answer to dplb_view_3";
      }
      done(v);
    });
  }
};

namespace {

std::vector<std::string> bucket_call(const std::string& prefix, std::string_view op,
                                     std::span<const shared_ledger::bucket_take> takes) {
  std::vector<std::string> argv{"FCALL", "dplb_bucket_3", std::to_string(takes.size())};
  for (const auto& t : takes) argv.push_back(prefix + ":bucket:" + t.bucket.name);
  argv.emplace_back(op);
  for (const auto& t : takes) {
    argv.push_back(number(t.bucket.rate));
    argv.push_back(std::to_string(t.bucket.burst));
    argv.push_back(std::to_string(t.units));
  }
  return argv;
}

}  // namespace

void shared_ledger::take(std::span<const bucket_take> takes, std::function<void(const bucket_answer&)> done) {
  impl_->commands.command("bucket", bucket_call(prefix_of(impl_->options), "take", takes),
                          [done = std::move(done), count = takes.size()](const redis_result& r) {
                            bucket_answer a;
                            a.error = r.error;
                            const auto& e = r.reply.elements;
                            const auto taken = e.size() == 3 ? number_of<long long>(e[0]) : std::nullopt;
                            const auto which = e.size() == 3 ? number_of<long long>(e[1]) : std::nullopt;
                            const auto wait = e.size() == 3 ? number_of<long long>(e[2]) : std::nullopt;
                            const bool well_formed = taken && which && wait &&
                                                     (*taken == 1 || (*which >= 1 && static_cast<std::size_t>(*which) <= count));
                            if (r.ok && well_formed) {
                              a.ok = true;
                              a.taken = *taken == 1;
                              if (!a.taken) a.refused = static_cast<std::size_t>(*which) - 1;
                              if (!a.taken && *wait >= 0) a.retry_after = std::chrono::milliseconds(*wait);
                            } else if (r.ok) {
                              a.error = "unexpected answer to dplb_bucket_3";
                            }
                            done(a);
                          });
}

void shared_ledger::take(const bucket_spec& bucket, std::uint64_t units, std::function<void(const bucket_answer&)> done) {
  const bucket_take one{bucket, units};
  take(std::span(&one, 1), std::move(done));
}

void shared_ledger::give_back(const bucket_spec& bucket, std::uint64_t units) {
  const bucket_take one{bucket, units};
  impl_->commands.command("bucket", bucket_call(prefix_of(impl_->options), "give", std::span(&one, 1)),
                          [](const redis_result&) {});
}

void shared_ledger::charge(const bucket_spec& bucket, std::uint64_t units) {
  const bucket_take one{bucket, units};
  impl_->commands.command("bucket", bucket_call(prefix_of(impl_->options), "charge", std::span(&one, 1)),
                          [](const redis_result&) {});
}

shared_ledger::shared_ledger(asio::io_context& io, ledger_options options, in_flight_fn in_flight, freed_fn on_freed)
    : impl_(std::make_shared<impl>(io, std::move(options), std::move(in_flight), std::move(on_freed))) {}

shared_ledger::~shared_ledger() { impl_->renew_timer.cancel(); }

void shared_ledger::start() { impl_->start(); }
void shared_ledger::pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
                         std::function<void(const ledger_pick&)> done) {
  impl_->pick(candidates, policy, limit, {}, 0, std::move(done));
}
void shared_ledger::pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
                         request_tokens tokens, std::function<void(const ledger_pick&)> done) {
  impl_->pick(candidates, policy, limit, tokens, 0, std::move(done));
}
void shared_ledger::pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
                         request_tokens tokens, std::size_t group, std::function<void(const ledger_pick&)> done) {
  impl_->pick(candidates, policy, limit, tokens, group, std::move(done));
}
void shared_ledger::release(std::size_t rank) { impl_->release(rank, 0, 0); }
void shared_ledger::release(std::size_t rank, std::uint64_t prompt_left, std::uint64_t cost) {
  impl_->release(rank, prompt_left, cost);
}
void shared_ledger::prompt_done(std::size_t rank, std::uint64_t prompt) { impl_->prompt_done(rank, prompt); }
void shared_ledger::register_in_flight() { impl_->register_when_settled(); }
void shared_ledger::view(std::function<void(const ledger_view&)> done) { impl_->view(std::move(done)); }
bool shared_ledger::up() const noexcept { return impl_->commands.up(); }
bool shared_ledger::subscribed() const noexcept { return impl_->freed.up(); }
std::uint64_t shared_ledger::errors(ledger_op op) const noexcept {
  return impl_->errors[static_cast<std::size_t>(op)].load(std::memory_order_relaxed);
}

}  // namespace dplb::ledger
