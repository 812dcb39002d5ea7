#include "dplb/balancer/replica_ledger.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <map>
#include <thread>

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
        ledger(io, options.ledger, [this] { return in_flight(); }, [](std::size_t) {}) {}

  // This replica's requests in flight per rank, as the balancer counts them (its registrations).
  std::map<std::size_t, ledger::rank_load> in_flight() const {
    std::map<std::size_t, ledger::rank_load> out;
    for (std::size_t r = 0; r < owner.rank_count(); ++r) {
      if (const auto n = owner.inflight(r); n > 0) {
        out[r] = ledger::rank_load{n, owner.prompt_inflight(r), owner.cost_inflight(r)};
      }
    }
    return out;
  }

  void refresh_view() {
    view_timer.expires_after(view_every);
    view_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      ledger.view([this](const ledger::ledger_view& v) {
        if (!v.ok) return;
        replicas.store(v.replicas, std::memory_order_relaxed);
        view_snapshot seen{v.replicas, v.total, std::chrono::steady_clock::now()};
        const std::lock_guard lock(view_mutex);
        last_view = std::move(seen);
      });
      refresh_view();
    });
  }

  balancer& owner;
  const replica_ledger_options options;
  // Declared before what runs on it, so destroyed after it.
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  asio::steady_timer view_timer;
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
  if (impl_->owner.queueing() || request.avoid != nullptr || !request.session_key.empty()) return false;
  if (request.pinned_rank) return true;
  return request.cluster < impl_->options.rules.size() && impl_->options.rules[request.cluster].has_value();
}

void replica_ledger::pick(const pick_context& request, request_cost cost, std::function<void(rank_lease)> done) {
  std::vector<weighted_rank> ranks;
  impl_->owner.candidates(request, ranks);
  if (ranks.empty()) {
    impl_->local.fetch_add(1, std::memory_order_relaxed);
    done({});
    return;
  }
  std::vector<ledger::ledger_candidate> candidates;
  candidates.reserve(ranks.size());
  for (const auto& r : ranks) candidates.push_back({r.rank, r.weight, r.floor});
  const auto rule = request.cluster < impl_->options.rules.size() && impl_->options.rules[request.cluster]
                        ? *impl_->options.rules[request.cluster]
                        : ledger::ledger_policy::least_inflight;
  // What the balancer counts of the request, kept here: the caller's views may be gone when the answer comes.
  pick_context counted;
  counted.cluster = request.cluster;
  counted.pinned_rank = request.pinned_rank;
  counted.prompt_tokens = request.prompt_tokens;
  counted.decode_tokens = request.decode_tokens;
  counted.prefilled_elsewhere = request.prefilled_elsewhere;
  if (cost.prompt == 0 && cost.decode == 0) cost.decode = 1;  // as the balancer counts it
  const auto asked = std::chrono::steady_clock::now();
  asio::post(impl_->io, [this, candidates = std::move(candidates), rule, counted, cost, asked,
                         done = std::move(done)]() mutable {
    impl_->ledger.pick(candidates, rule, 0, ledger::request_tokens{cost.prompt, cost.decode},
                       [this, counted, cost, asked, done = std::move(done)](const ledger::ledger_pick& answer) {
                         impl_->pick_seconds.observe(
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count());
                         if (answer.ok) impl_->replicas.store(answer.replicas, std::memory_order_relaxed);
                         rank_lease lease;
                         if (answer.ok && answer.rank) {
                           lease = impl_->owner.acquire_chosen(*answer.rank, counted, cost);
                           // Chosen but gone here (drained, down): the ledger's count goes back at once.
                           if (!lease) impl_->ledger.release(*answer.rank, cost.prompt, std::uint64_t{cost.prompt} + cost.decode);
                         }
                         (lease ? impl_->shared : impl_->local).fetch_add(1, std::memory_order_relaxed);
                         done(std::move(lease));
                       });
  });
}

void replica_ledger::view(std::function<void(const ledger::ledger_view&)> done) {
  asio::post(impl_->io, [this, done = std::move(done)]() mutable { impl_->ledger.view(std::move(done)); });
}

void replica_ledger::released(std::size_t rank, request_cost held) noexcept {
  if (!impl_->running.load(std::memory_order_acquire)) return;
  try {
    asio::post(impl_->io, [this, rank, held] {
      impl_->ledger.release(rank, held.prompt, std::uint64_t{held.prompt} + held.decode);
    });
  } catch (...) {
    // Out of memory: the next registration puts the count right.
  }
}

void replica_ledger::prompt_done(std::size_t rank, std::uint32_t prompt) noexcept {
  if (!impl_->running.load(std::memory_order_acquire)) return;
  try {
    asio::post(impl_->io, [this, rank, prompt] { impl_->ledger.prompt_done(rank, prompt); });
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
