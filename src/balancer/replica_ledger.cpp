#include "dplb/balancer/replica_ledger.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

namespace dplb::balancer {

namespace asio = boost::asio;

std::optional<ledger::ledger_policy> ledger_rule_for(std::string_view policy_name) {
  if (policy_name == "least-inflight") return ledger::ledger_policy::least_inflight;
  if (policy_name == "round-robin") return ledger::ledger_policy::round_robin;
  if (policy_name == "least-tokens") return ledger::ledger_policy::least_tokens;
  if (policy_name == "least-load") return ledger::ledger_policy::least_load;
  return std::nullopt;
}

namespace {

// A pick's round trip on loopback is tens of microseconds; a remote Redis adds its network's.
std::vector<double> pick_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25};
}

// How often the replicas seen (and the admin page's view) are refreshed when no pick says it.
constexpr std::chrono::seconds view_every{1};

}  // namespace

struct replica_ledger::impl {
  impl(balancer& b, replica_ledger_options o)
      : owner(b), options(std::move(o)), view_timer(io),
        ledger(io, options.ledger, [this] { return in_flight(); }, [this](std::size_t rank) { serve(rank); }) {}

  // This replica's requests in flight per rank, as it has told the ledger of them: the mirror, changed only
  // on this thread, in the order the calls go to Redis (a pick answered, a pick made here, a release, a first
  // byte), whether Redis is up or not. So a registration (sent from this thread) is exact however picks and
  // releases race on other threads, and puts back what was picked while Redis was away.
  std::map<std::size_t, ledger::rank_load> in_flight() const { return mirror; }

  void mirror_add(std::size_t rank, request_cost cost) {
    auto& m = mirror[rank];
    ++m.requests;
    m.prompt_tokens += cost.prompt;
    m.cost_tokens += std::uint64_t{cost.prompt} + cost.decode;
  }
  void mirror_take(std::size_t rank, std::uint32_t requests, std::uint64_t prompt, std::uint64_t cost) {
    const auto it = mirror.find(rank);
    if (it == mirror.end()) return;
    auto& m = it->second;
    m.requests -= std::min(m.requests, requests);
    m.prompt_tokens -= std::min(m.prompt_tokens, prompt);
    m.cost_tokens -= std::min(m.cost_tokens, cost);
    if (m.requests == 0) mirror.erase(it);
  }

  void refresh_view() {
    view_timer.expires_after(view_every);
    view_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      ledger.view([this](const ledger::ledger_view& v) {
        if (!v.ok) {
          // Redis away for a few seconds: the others' requests then seen have mostly ended.
          if (++views_failed == 5) forget_others();
          return;
        }
        views_failed = 0;
        std::vector<std::size_t> ranks(owner.rank_count());
        std::vector<std::uint32_t> counts(ranks.size());
        for (std::size_t r = 0; r < ranks.size(); ++r) {
          ranks[r] = r;
          counts[r] = v.total.contains(r) ? v.total.at(r) : 0;
        }
        learn_others(ranks, counts);
        replicas.store(v.replicas, std::memory_order_relaxed);
        view_snapshot seen{v.replicas, v.total, std::chrono::steady_clock::now()};
        const std::lock_guard lock(view_mutex);
        last_view = std::move(seen);
      });
      refresh_view();
    });
  }

  // --- the waiters (all on the ledger's thread) ---
  struct waiter {
    pick_context request;  // without the caller's views
    request_cost cost;
    std::function<void(rank_lease)> deliver;
  };
  using waiter_key = std::pair<std::int64_t, std::uint64_t>;  // priority, then arrival (the id)

  ledger::ledger_policy rule_for(const pick_context& request) const {
    const bool has_rule = request.cluster < options.rules.size() && options.rules[request.cluster];
    return has_rule ? *options.rules[request.cluster] : ledger::ledger_policy::least_inflight;
  }

  std::vector<ledger::ledger_candidate> candidates_for(const pick_context& request) const {
    std::vector<weighted_rank> ranks;
    owner.candidates(request, ranks);
    std::vector<ledger::ledger_candidate> out;
    out.reserve(ranks.size());
    for (const auto& r : ranks) out.push_back({r.rank, r.weight, r.floor});
    return out;
  }

  // Asks the ledger for a slot for one waiter: the first whose candidates include the freed rank, or the
  // first of all when no rank is named (a tick, a grant that may leave more room). One ask at a time: an
  // event during it asks again once it is answered.
  void serve(std::optional<std::size_t> freed) {
    if (asking) {
      ask_again = true;
      return;
    }
    for (auto it = waiters.begin(); it != waiters.end(); ++it) {
      auto candidates = candidates_for(it->second.request);
      if (candidates.empty()) {  // its ranks are gone here: the local queue turns it away
        fall_back(it);
        serve(freed);
        return;
      }
      if (freed && std::ranges::none_of(candidates, [&](const auto& c) { return c.rank == *freed; })) continue;
      ask_for(it->first, std::move(candidates));
      return;
    }
  }

  // One pick asked of the ledger under --max-inflight-per-rank, for an arriving request or a waiter, on this
  // thread. The answer teaches the others' counts; a rank chosen is counted in the balancer (and mirrored), or,
  // no longer usable here, given back at once. `then` gets the answer and the lease (empty unless counted).
  void ask(const pick_context& counted, request_cost cost, std::vector<ledger::ledger_candidate> candidates,
           std::function<void(const ledger::ledger_pick&, rank_lease)> then) {
    const auto tokens = sent(cost);
    std::vector<std::size_t> ranks;
    for (const auto& c : candidates) ranks.push_back(c.rank);
    ledger.pick(candidates, rule_for(counted), owner.limits().max_inflight_per_rank,
                ledger::request_tokens{tokens.prompt, tokens.decode}, counted.cluster,
                [this, counted, cost, tokens, ranks = std::move(ranks),
                 then = std::move(then)](const ledger::ledger_pick& answer) {
                  rank_lease lease;
                  if (answer.ok) {
                    replicas.store(answer.replicas, std::memory_order_relaxed);
                    learn_others(ranks, answer.counts);
                  }
                  if (answer.ok && answer.rank) {
                    lease = owner.acquire_chosen(*answer.rank, counted, cost);
                    if (lease) {
                      mirror_add(*answer.rank, tokens);
                    } else {  // chosen but gone here (drained, down): the ledger's count goes back
                      ledger.release(*answer.rank, tokens.prompt, std::uint64_t{tokens.prompt} + tokens.decode);
                    }
                  }
                  then(answer, std::move(lease));
                });
  }

  // A waiter's ask. A lease for a waiter that gave up meanwhile is released where it is dropped here.
  void ask_for(waiter_key key, std::vector<ledger::ledger_candidate> candidates) {
    asking = true;
    const auto& w = waiters.at(key);
    ask(w.request, w.cost, std::move(candidates), [this, key](const ledger::ledger_pick& answer, rank_lease lease) {
      asking = false;
      if (!answer.ok) {  // the ledger stopped answering: every waiter waits locally
        while (!waiters.empty()) fall_back(waiters.begin());
        return;
      }
      const auto found = waiters.find(key);
      if (lease && found != waiters.end()) {
        shared.fetch_add(1, std::memory_order_relaxed);
        auto deliver = std::move(found->second.deliver);
        waiters.erase(found);
        waiter_count.store(waiters.size(), std::memory_order_relaxed);
        deliver(std::move(lease));
      }
      // A rank was chosen: there may be more room. Or an event came while this ask was out.
      if (std::exchange(ask_again, false) || answer.rank) serve(std::nullopt);
    });
  }

  void fall_back(std::map<waiter_key, waiter>::iterator it) {
    auto deliver = std::move(it->second.deliver);
    waiters.erase(it);
    waiter_count.store(waiters.size(), std::memory_order_relaxed);
    local.fetch_add(1, std::memory_order_relaxed);
    deliver({});
  }

  // While anyone waits, the head asks every 50 ms: no waiter depends on the freed-slot channel alone.
  void tick() {
    if (ticking || waiters.empty()) return;
    ticking = true;
    tick_timer.expires_after(std::chrono::milliseconds(50));
    tick_timer.async_wait([this](const boost::system::error_code& ec) {
      ticking = false;
      if (ec) return;
      serve(std::nullopt);
      tick();
    });
  }

  // The tokens of a request: only least-tokens weighs them in the ledger. Without it none are sent, and the
  // first byte needs no call at all.
  request_cost sent(request_cost cost) const { return weigh_tokens ? cost : request_cost{}; }

  // The other replicas' requests per rank, from the ledger's counts (which include this replica's: the
  // mirror). `counts` in the order of `ranks`.
  void learn_others(std::span<const std::size_t> ranks, std::span<const std::uint32_t> counts) {
    for (std::size_t i = 0; i < ranks.size() && i < counts.size(); ++i) {
      const auto own = mirror.contains(ranks[i]) ? mirror.at(ranks[i]).requests : 0;
      owner.set_others(ranks[i], counts[i] > own ? counts[i] - own : 0);
    }
  }
  void forget_others() {
    for (std::size_t r = 0; r < owner.rank_count(); ++r) owner.set_others(r, 0);
  }

  balancer& owner;
  const replica_ledger_options options;
  const bool weigh_tokens = std::ranges::any_of(
      options.rules, [](const auto& rule) { return rule == ledger::ledger_policy::least_tokens; });
  std::map<std::size_t, ledger::rank_load> mirror;  // in_flight()
  int views_failed = 0;  // in a row: after a few, the others' counts are too old to weigh
  // Declared before what runs on it, so destroyed after it.
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  asio::steady_timer view_timer;
  asio::steady_timer tick_timer{io};
  std::map<waiter_key, waiter> waiters;
  bool asking = false, ask_again = false, ticking = false;
  std::atomic<std::size_t> waiter_count{0};
  std::atomic<std::uint64_t> next_waiter{1};
  ledger::shared_ledger ledger;
  std::thread thread;
  std::atomic<bool> running{false};
  std::atomic<std::uint32_t> replicas{0};
  std::atomic<std::uint64_t> shared{0}, local{0};
  support::atomic_histogram pick_seconds{pick_buckets()};
  mutable std::mutex view_mutex;
  std::optional<view_snapshot> last_view;  // guarded by view_mutex
};

replica_ledger::replica_ledger(balancer& b, replica_ledger_options options)
    : impl_(std::make_unique<impl>(b, std::move(options))) {}

replica_ledger::~replica_ledger() { stop(); }

void replica_ledger::start() {
  impl_->running.store(true, std::memory_order_release);
  asio::post(impl_->io, [this] {
    impl_->ledger.start();
    impl_->refresh_view();
  });
  impl_->thread = std::thread([this] {
    for (;;) {
      try {
        impl_->io.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("shared state: {}; its thread goes on", e.what());
      }
    }
  });
}

void replica_ledger::stop() noexcept {
  if (!impl_->running.exchange(false, std::memory_order_acq_rel)) return;
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

bool replica_ledger::picks(const pick_context& request) const noexcept {
  if (!impl_->running.load(std::memory_order_acquire) || !impl_->ledger.up()) return false;
  if (request.avoid != nullptr || !request.session_key.empty()) return false;
  if (request.pinned_rank) return true;
  return request.cluster < impl_->options.rules.size() && impl_->options.rules[request.cluster].has_value();
}

namespace {

// What the balancer counts of a request, kept by the ledger's thread: the caller's views (prefix chains, a
// session key, tried ranks) may be gone by the time the answer comes.
pick_context counted_part(const pick_context& request) {
  return pick_context{.prompt_tokens = request.prompt_tokens,
                      .decode_tokens = request.decode_tokens,
                      .pinned_rank = request.pinned_rank,
                      .cluster = request.cluster,
                      .prefilled_elsewhere = request.prefilled_elsewhere};
}

}  // namespace

void replica_ledger::pick(const pick_context& request, request_cost cost,
                          std::function<void(rank_lease, pick_outcome)> done) {
  auto candidates = impl_->candidates_for(request);
  if (candidates.empty()) {
    impl_->local.fetch_add(1, std::memory_order_relaxed);
    done({}, pick_outcome::unanswered);
    return;
  }
  const auto asked = std::chrono::steady_clock::now();
  asio::post(impl_->io, [this, candidates = std::move(candidates), counted = counted_part(request),
                         cost = balancer::at_least_one_token(cost), asked, done = std::move(done)]() mutable {
    impl_->ask(counted, cost, std::move(candidates),
               [this, asked, done = std::move(done)](const ledger::ledger_pick& answer, rank_lease lease) {
                 impl_->pick_seconds.observe(
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count());
                 const auto outcome = lease                         ? pick_outcome::chosen
                                      : answer.ok && !answer.rank ? pick_outcome::full
                                                                  : pick_outcome::unanswered;
                 if (outcome != pick_outcome::full) {
                   (lease ? impl_->shared : impl_->local).fetch_add(1, std::memory_order_relaxed);
                 }
                 done(std::move(lease), outcome);
               });
  });
}

std::uint64_t replica_ledger::wait(const pick_context& request, request_cost cost, std::int64_t priority,
                                   std::function<void(rank_lease)> deliver) {
  if (impl_->waiter_count.load(std::memory_order_relaxed) >= impl_->owner.limits().max_waiting) return 0;
  const auto id = impl_->next_waiter.fetch_add(1, std::memory_order_relaxed);
  impl_->waiter_count.fetch_add(1, std::memory_order_relaxed);  // counted at once: the bound holds
  asio::post(impl_->io, [this, id, priority, counted = counted_part(request), cost = balancer::at_least_one_token(cost),
                         deliver = std::move(deliver)]() mutable {
    impl_->waiters.emplace(impl::waiter_key{priority, id}, impl::waiter{counted, cost, std::move(deliver)});
    impl_->waiter_count.store(impl_->waiters.size(), std::memory_order_relaxed);
    impl_->serve(std::nullopt);  // a slot may have freed since the pick that found none
    impl_->tick();
  });
  return id;
}

void replica_ledger::cancel(std::uint64_t id) {
  asio::post(impl_->io, [this, id] {
    const auto it = std::ranges::find_if(impl_->waiters, [id](const auto& w) { return w.first.second == id; });
    if (it == impl_->waiters.end()) return;  // served already: the caller releases the lease where it lands
    impl_->waiters.erase(it);
    impl_->waiter_count.store(impl_->waiters.size(), std::memory_order_relaxed);
  });
}

std::size_t replica_ledger::waiting() const noexcept { return impl_->waiter_count.load(std::memory_order_relaxed); }

void replica_ledger::view(std::function<void(const ledger::ledger_view&)> done) {
  asio::post(impl_->io, [this, done = std::move(done)]() mutable { impl_->ledger.view(std::move(done)); });
}

void replica_ledger::take(std::vector<bucket_take> takes, std::function<void(const ledger::bucket_answer&)> done) {
  if (!impl_->running.load(std::memory_order_acquire)) {
    ledger::bucket_answer stopped;
    stopped.error = "the shared state is stopped";
    done(stopped);
    return;
  }
  asio::post(impl_->io, [this, takes = std::move(takes), done = std::move(done)]() mutable {
    impl_->ledger.take(takes, std::move(done));
  });
}

void replica_ledger::give_back(bucket_spec bucket, std::uint64_t units) noexcept {
  if (!impl_->running.load(std::memory_order_acquire) || units == 0) return;
  try {
    asio::post(impl_->io, [this, bucket = std::move(bucket), units] { impl_->ledger.give_back(bucket, units); });
  } catch (...) {
  }
}

void replica_ledger::charge(bucket_spec bucket, std::uint64_t units) noexcept {
  if (!impl_->running.load(std::memory_order_acquire) || units == 0) return;
  try {
    asio::post(impl_->io, [this, bucket = std::move(bucket), units] { impl_->ledger.charge(bucket, units); });
  } catch (...) {
  }
}

// A request picked here (a policy the ledger does not pick for, an affinity header, a retry, or Redis away):
// recorded in the ledger as a pick with that one candidate and no limit, so that every release matches a
// count the ledger had. (Out of memory, a post is lost: the mirror then misses it, and so does Redis.)
void replica_ledger::picked(std::size_t rank, request_cost counted) noexcept {
  if (!impl_->running.load(std::memory_order_acquire)) return;
  try {
    const auto group = impl_->owner.cluster_of(rank);
    asio::post(impl_->io, [this, rank, counted, group] {
      const auto tokens = impl_->sent(counted);
      impl_->mirror_add(rank, tokens);
      const ledger::ledger_candidate only{rank, 1, 0};
      impl_->ledger.pick(std::span(&only, 1), ledger::ledger_policy::least_inflight, 0,
                         ledger::request_tokens{tokens.prompt, tokens.decode}, group,
                         [](const ledger::ledger_pick&) {});
    });
  } catch (...) {
  }
}

void replica_ledger::released(std::size_t rank, request_cost held) noexcept {
  if (!impl_->running.load(std::memory_order_acquire)) return;
  try {
    asio::post(impl_->io, [this, rank, held] {
      const auto tokens = impl_->sent(held);
      const std::uint64_t cost = std::uint64_t{tokens.prompt} + tokens.decode;
      impl_->mirror_take(rank, 1, tokens.prompt, cost);
      impl_->ledger.release(rank, tokens.prompt, cost);
    });
  } catch (...) {
  }
}

void replica_ledger::prompt_done(std::size_t rank, std::uint32_t prompt) noexcept {
  if (!impl_->running.load(std::memory_order_acquire) || !impl_->weigh_tokens) return;
  try {
    asio::post(impl_->io, [this, rank, prompt] {
      impl_->mirror_take(rank, 0, prompt, prompt);
      impl_->ledger.prompt_done(rank, prompt);
    });
  } catch (...) {
  }
}

std::optional<replica_ledger::view_snapshot> replica_ledger::last_view() const {
  const std::lock_guard lock(impl_->view_mutex);
  return impl_->last_view;
}

const std::string& replica_ledger::replica_name() const noexcept { return impl_->options.ledger.replica; }
bool replica_ledger::up() const noexcept { return impl_->ledger.up(); }
std::uint64_t replica_ledger::errors(ledger::ledger_op op) const noexcept { return impl_->ledger.errors(op); }
std::uint32_t replica_ledger::replicas() const noexcept { return impl_->replicas.load(std::memory_order_relaxed); }
const support::atomic_histogram& replica_ledger::pick_seconds() const noexcept { return impl_->pick_seconds; }
std::uint64_t replica_ledger::shared_picks() const noexcept { return impl_->shared.load(std::memory_order_relaxed); }
std::uint64_t replica_ledger::local_picks() const noexcept { return impl_->local.load(std::memory_order_relaxed); }

}  // namespace dplb::balancer
