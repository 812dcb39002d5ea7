#include "sim_engine.hpp"

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <cassert>
#include <cmath>
#include <utility>

#include "engine_metrics.hpp"
#include "kv_event_publisher.hpp"

namespace dplb::mock {
namespace {

namespace asio = boost::asio;
using std::chrono::steady_clock;

// Steps a late clock may end in one turn of the event loop (see on_step_end).
constexpr unsigned max_steps_per_turn = 16;

}  // namespace

sim_stream::sim_stream(sim::request_id id, unsigned engine, std::uint64_t prompt_tokens,
                       sim::chain_builder prompt_chain, std::uint64_t max_tokens, bool wake_each_token,
                       asio::steady_timer& waker, bool remote_prefilled, bool hold)
    : id_(id),
      engine_(engine),
      prompt_tokens_(prompt_tokens),
      prompt_chain_(std::move(prompt_chain)),
      max_tokens_(max_tokens),
      wake_each_token_(wake_each_token),
      remote_prefilled_(remote_prefilled),
      hold_(hold),
      executor_(waker.get_executor()),
      context_(&asio::query(waker.get_executor(), asio::execution::context)),
      waker_(&waker) {}

// One clock and the engines it steps: all of them with --dp-lockstep, else one.
struct sim_engine::clock_state {
  clock_state(asio::io_context& context, const sim::engine_config& config, std::vector<unsigned> member_engines,
              std::vector<sim::batch_scheduler*> members)
      : timer(context), engines(std::move(member_engines)), clock(config, std::move(members)) {}

  asio::steady_timer timer;
  std::vector<unsigned> engines;
  sim::lockstep_clock clock;
  bool kick_pending = false;  // a kick is posted: arrivals in the same event-loop turn start one step
};

sim_engine::sim_engine(asio::io_context& context, const mock_options& options,
                       std::vector<engine_metrics*> engines)
    : context_(context),
      engines_(std::move(engines)),
      time_scale_(options.time_scale),
      start_after_(options.start_after),
      epoch_(steady_clock::now()) {
  const auto& config = options.engine;
  for (auto* metrics : engines_) {
    schedulers_.push_back(std::make_unique<sim::batch_scheduler>(config));
    metrics->simulated = true;
    metrics->kv_block_size = config.kv.block_size;
    metrics->kv_blocks = config.kv.num_blocks;
    metrics->prefix_caching = config.kv.prefix_caching;
  }
  const auto count = static_cast<unsigned>(engines_.size());
  if (options.dp_lockstep) {
    std::vector<unsigned> all;
    std::vector<sim::batch_scheduler*> members;
    for (unsigned e = 0; e < count; ++e) {
      all.push_back(e);
      members.push_back(schedulers_[e].get());
    }
    clocks_.push_back(std::make_unique<clock_state>(context, config, std::move(all), std::move(members)));
    clock_of_engine_.assign(count, 0);
  } else {
    for (unsigned e = 0; e < count; ++e) {
      clocks_.push_back(std::make_unique<clock_state>(context, config, std::vector<unsigned>{e},
                                                      std::vector<sim::batch_scheduler*>{schedulers_[e].get()}));
      clock_of_engine_.push_back(e);
    }
  }
  tokens_.reserve(1024);
}

sim_engine::~sim_engine() = default;

void sim_engine::shutdown() {
  accepting_.store(false, std::memory_order_release);
  clocks_.clear();  // the timers belong to thread 0's context, which goes before the engine
  streams_.clear();
  kv_publisher_ = nullptr;
}

void sim_engine::publish_kv_events(kv_event_publisher& publisher, const kv_event_format& format, unsigned dp) {
  kv_publisher_ = &publisher;
  kv_format_ = format;
  dp_ = dp;
  kv_pending_.assign(schedulers_.size(), {});
}

void sim_engine::reset_prefix_cache(unsigned scheduler) {
  assert(context_.get_executor().running_in_this_thread());
  schedulers_[scheduler]->reset_prefix_cache();
  if (kv_publisher_ == nullptr) return;
  auto events = schedulers_[scheduler]->take_kv_events();
  auto& pending = kv_pending_[scheduler];
  pending.insert(pending.end(), std::make_move_iterator(events.begin()), std::make_move_iterator(events.end()));
  flush_kv_events(scheduler);
}

void sim_engine::collect_kv_events(const clock_state& clock) {
  if (kv_publisher_ == nullptr) return;
  for (const auto engine : clock.engines) {
    auto events = schedulers_[engine]->take_kv_events();
    auto& pending = kv_pending_[engine];
    if (pending.empty()) {
      pending = std::move(events);
    } else {
      pending.insert(pending.end(), std::make_move_iterator(events.begin()), std::make_move_iterator(events.end()));
    }
  }
}

void sim_engine::flush_kv_events(unsigned engine) {
  if (kv_publisher_ == nullptr) return;  // (kv_pending_ is sized only with a publisher)
  auto& pending = kv_pending_[engine];
  if (pending.empty()) return;  // a step that changed nothing sends nothing
  const auto ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  kv_publisher_->publish(engine, encode_event_batch(ts, pending, engine % dp_, kv_format_), pending.size());
  pending.clear();
}

std::size_t sim_engine::cached_prefix(unsigned scheduler, std::span<const sim::block_hash> chain) const {
  assert(context_.get_executor().running_in_this_thread());
  return schedulers_[scheduler]->kv_cache().cached_prefix(chain);
}

void sim_engine::submit(std::shared_ptr<sim_stream> stream) {
  if (!accepting()) return;
  asio::dispatch(context_, [this, s = std::move(stream)]() mutable { enqueue(std::move(s)); });
}

void sim_engine::abort(std::shared_ptr<sim_stream> stream) {
  if (!accepting()) return;
  asio::dispatch(context_, [this, s = std::move(stream)] { remove(*s); });
}

void sim_engine::enqueue(std::shared_ptr<sim_stream> stream) {
  if (clocks_.empty()) return;  // shut down meanwhile
  const auto engine = stream->engine_;
  schedulers_[engine]->submit(stream->id_, stream->prompt_tokens_, stream->max_tokens_,
                              std::move(stream->prompt_chain_), stream->remote_prefilled_, stream->hold_);
  streams_.emplace(stream->id_, std::move(stream));
  ++arrived_;
  if (arrived_ < start_after_) return;  // held: the burst is not all here yet
  if (arrived_ == start_after_ && start_after_ > 1) {
    // The last of the held burst: every clock with work starts now, in the same turn.
    for (unsigned c = 0; c < clocks_.size(); ++c) {
      if (clocks_[c]->kick_pending || clocks_[c]->clock.stepping()) continue;
      clocks_[c]->kick_pending = true;
      asio::post(context_, [this, c] { kick(c); });
    }
    return;
  }
  auto& clock = *clocks_[clock_of_engine_[engine]];
  // Not published here: like vLLM's scheduler stats, the gauges change once per step, so a request
  // that arrives mid-step shows in vllm:num_requests_waiting only when that step ends. A balancer
  // reading them is always at least that far behind, as it is against a real engine.
  if (!clock.clock.stepping() && !clock.kick_pending) {
    // Not at once: requests read in the same turn of the event loop (a burst) join the same first step.
    clock.kick_pending = true;
    asio::post(context_, [this, c = clock_of_engine_[engine]] { kick(c); });
  }
}

void sim_engine::remove(const sim_stream& stream) {
  if (clocks_.empty()) return;
  auto& scheduler = *schedulers_[stream.engine_];
  if (streams_.erase(stream.id_) != 0) {
    scheduler.abort(stream.id_);
  } else if (!stream.hold_ || !scheduler.release_held(stream.id_)) {
    return;  // finished meanwhile (a `hold` request's blocks, kept, are freed: nobody will pull them now)
  }
  publish(*clocks_[clock_of_engine_[stream.engine_]]);
}

void sim_engine::release_held(unsigned scheduler, sim::request_id id) {
  if (!accepting()) return;
  asio::post(context_, [this, scheduler, id] {
    if (clocks_.empty()) return;
    if (schedulers_[scheduler]->release_held(id)) publish(*clocks_[clock_of_engine_[scheduler]]);
  });
}

void sim_engine::kick(unsigned clock) {
  if (clock >= clocks_.size()) return;
  auto& c = *clocks_[clock];
  c.kick_pending = false;
  if (c.clock.begin_step(sim_now())) {
    collect_kv_events(c);
    publish(c);
    arm(clock);
  }
}

void sim_engine::arm(unsigned clock) {
  auto& c = *clocks_[clock];
  c.timer.expires_at(wall_time(c.clock.step_end()));
  c.timer.async_wait([this, clock](const boost::system::error_code& ec) {
    if (!ec) on_step_end(clock);
  });
}

void sim_engine::on_step_end(unsigned clock) {
  auto& c = *clocks_[clock];
  const auto now = steady_clock::now();
  tokens_.clear();
  // Every step already due ends here, in order, and their tokens go out together. On time, that is the
  // one step the timer was set for; a loop that fell behind (a busy core, a high --time-scale) catches
  // up with one write per stream for several steps instead of one per step, which is what lets it
  // catch up at all. Bounded, so that the loop still serves its connections meanwhile.
  for (unsigned n = 0; n < max_steps_per_turn && c.clock.stepping(); ++n) {
    const auto end = c.clock.step_end();
    if (n > 0 && wall_time(end) > now) break;
    // The next step begins where this one ended, not at the handler's (possibly late) wall time: the
    // simulated clock stays exact whatever the loop's delays; only the delivery is late, by `lag`.
    const auto lag = std::max(steady_clock::duration::zero(), now - wall_time(end));
    const auto step_ns = static_cast<std::uint64_t>((end - c.clock.step_begin()).count());
    const auto lag_ns =
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(lag).count());
    c.clock.end_step(tokens_);
    for (const auto engine : c.engines) {
      auto& m = *engines_[engine];
      m.sim_step_ns.fetch_add(step_ns, std::memory_order_relaxed);
      m.sim_lag_ns.fetch_add(lag_ns, std::memory_order_relaxed);
      flush_kv_events(engine);
    }
    if (c.clock.begin_step(end)) collect_kv_events(c);
  }
  deliver(tokens_);
  publish(c);
  if (c.clock.stepping()) arm(clock);
}

// Each token is announced to its session: directly when the session runs on this thread, else with
// one post per thread per step.
void sim_engine::deliver(const std::vector<sim::token_event>& tokens) {
  std::vector<std::pair<asio::execution_context*, std::vector<std::shared_ptr<sim_stream>>>> foreign;
  for (const auto& token : tokens) {
    const auto at = streams_.find(token.id);
    if (at == streams_.end()) continue;
    auto& stream = at->second;
    stream->produced_.fetch_add(1, std::memory_order_release);
    if (stream->wake_each_token_ || token.last) {
      if (stream->context_ == &context_) {
        stream->wake();
      } else {
        auto batch = foreign.begin();
        while (batch != foreign.end() && batch->first != stream->context_) ++batch;
        if (batch == foreign.end())
          batch =
              foreign.emplace(foreign.end(), stream->context_, std::vector<std::shared_ptr<sim_stream>>{});
        batch->second.push_back(stream);
      }
    }
    if (token.last) streams_.erase(at);
  }
  for (auto& [context, streams] : foreign) {
    const auto executor = streams.front()->executor_;
    asio::post(executor, [woken = std::move(streams)] {
      for (const auto& stream : woken) stream->wake();
    });
  }
}

void sim_engine::publish(const clock_state& clock) {
  for (const auto engine : clock.engines) {
    const auto& s = *schedulers_[engine];
    auto& m = *engines_[engine];
    m.requests_running.store(static_cast<std::int64_t>(s.running()), std::memory_order_relaxed);
    m.requests_waiting.store(static_cast<std::int64_t>(s.waiting()), std::memory_order_relaxed);
    m.sim_steps.store(s.steps(), std::memory_order_relaxed);
    m.sim_padded_tokens.store(s.padded_tokens(), std::memory_order_relaxed);
    m.sim_even_padded_tokens.store(s.even_padded_tokens(), std::memory_order_relaxed);
    m.sim_real_tokens.store(s.real_tokens(), std::memory_order_relaxed);
    m.sim_prompt_pending.store(s.prompt_tokens_pending(), std::memory_order_relaxed);
    m.sim_decode_pending.store(s.decode_tokens_pending(), std::memory_order_relaxed);
    const auto& kv = s.kv_cache();
    m.kv_cache_usage.store(static_cast<double>(kv.used_blocks()) / static_cast<double>(kv.config().num_blocks),
                           std::memory_order_relaxed);
    m.sim_kv_tokens.store(s.kv_tokens(), std::memory_order_relaxed);
    m.prefix_queries.store(s.prefix_queries(), std::memory_order_relaxed);
    m.prefix_hits.store(s.prefix_hits(), std::memory_order_relaxed);
    m.preemptions.store(s.preemptions(), std::memory_order_relaxed);
  }
}

sim::sim_time sim_engine::sim_now() const {
  const auto wall = std::chrono::duration_cast<std::chrono::nanoseconds>(steady_clock::now() - epoch_);
  return sim::sim_time(
      static_cast<std::int64_t>(std::llround(static_cast<double>(wall.count()) * time_scale_)));
}

steady_clock::time_point sim_engine::wall_time(sim::sim_time t) const {
  return epoch_ + std::chrono::nanoseconds(
                      static_cast<std::int64_t>(std::llround(static_cast<double>(t.count()) / time_scale_)));
}

sim_request::sim_request(sim_engine& engine, unsigned scheduler, std::uint64_t prompt_tokens,
                         sim::chain_builder prompt_chain, std::uint64_t max_tokens, bool stream,
                         asio::steady_timer& waker, bool remote_prefilled, bool hold)
    : engine_(engine),
      stream_(std::make_shared<sim_stream>(engine.next_id(), scheduler, prompt_tokens, std::move(prompt_chain),
                                           max_tokens, stream, waker, remote_prefilled, hold)) {
  engine_.submit(stream_);
}

sim_request::~sim_request() {
  stream_->waker_ = nullptr;  // a wake still on its way finds nobody listening
  // Unfinished: aborted. Finished with blocks held that nobody took over: freed (remove() does both).
  if (!stream_->finished() || (stream_->hold_ && !handed_over_)) engine_.abort(std::move(stream_));
}

std::function<void()> sim_request::hand_over_hold() {
  handed_over_ = true;
  return [engine = &engine_, scheduler = stream_->engine_, id = stream_->id_] { engine->release_held(scheduler, id); };
}

}  // namespace dplb::mock
