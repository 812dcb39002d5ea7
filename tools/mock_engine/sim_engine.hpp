#pragma once
// Simulated serving (--simulate), the I/O shell around the pure core (batch_scheduler.hpp,
// lockstep_clock.hpp): one scheduler per DP engine (each engine of each port) and one steady_timer per
// clock (one for the process with --dp-lockstep, else one per engine), all on the event loop of thread 0. Sessions, on any thread, submit
// requests and are woken at most once per step in which their request produced a token (a late loop
// ends several due steps at once: one wake for all); no timer per token and no timer per request.
//
// Time: simulated durations are divided by --time-scale X to get wall time. The scheduler and the
// metrics it publishes (vllm:num_requests_running/_waiting, mock_steps_total, ...) follow the
// simulation; everything a client measures is wall time, so benchmark latencies must be multiplied by
// X (and throughputs divided by X) to read as the simulated engine's.

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "batch_scheduler.hpp"
#include "kv_event_encoder.hpp"
#include "lockstep_clock.hpp"
#include "mock_options.hpp"

namespace dplb::mock {

struct engine_metrics;
class kv_event_publisher;
class sim_engine;

// One simulated request as its session sees it. The engine (thread 0) counts `produced`, which the
// session reads after each wake; `waker_` belongs to the session's thread; the rest never changes.
class sim_stream {
 public:
  // `waker` is the session's timer; its executor is the session's thread.
  sim_stream(sim::request_id id, unsigned engine, std::uint64_t prompt_tokens,
             sim::chain_builder prompt_chain, std::uint64_t max_tokens, bool wake_each_token,
             boost::asio::steady_timer& waker, bool remote_prefilled = false, bool hold = false);

  // Tokens produced so far (each at the end of a step), up to max_tokens.
  std::uint64_t produced() const { return produced_.load(std::memory_order_acquire); }
  std::uint64_t max_tokens() const { return max_tokens_; }
  bool finished() const { return produced() >= max_tokens_; }

 private:
  friend class sim_engine;
  friend class sim_request;

  // On the session's thread: cancels the session's wait, if the session still listens.
  void wake() {
    if (waker_ != nullptr) waker_->cancel();
  }

  const sim::request_id id_;
  const unsigned engine_;  // the scheduler's index
  const std::uint64_t prompt_tokens_;
  sim::chain_builder prompt_chain_;  // moved into the scheduler at submission (thread 0)
  const std::uint64_t max_tokens_;
  const bool wake_each_token_;  // false (non-streaming): only the last token wakes the session
  const bool remote_prefilled_;  // --kv-role decode: the prompt's KV was pulled (batch_scheduler::submit)
  const bool hold_;              // --kv-role prefill: the blocks stay allocated once finished (ditto)
  const boost::asio::any_io_executor executor_;    // the session's
  boost::asio::execution_context* const context_;  // the session's event loop
  boost::asio::steady_timer* waker_;  // the session's timer; null once the session stopped listening
  std::atomic<std::uint64_t> produced_{0};
};

class sim_engine {
 public:
  // Runs on `context` (thread 0's); engines[i] is the metrics of scheduler i (every DP engine of every
  // port); they and the options must outlive the engine.
  sim_engine(boost::asio::io_context& context, const mock_options& options,
             std::vector<engine_metrics*> engines);
  ~sim_engine();
  sim_engine(const sim_engine&) = delete;
  sim_engine& operator=(const sim_engine&) = delete;

  // Before the event loops are destroyed: timers go, and later submits and aborts are ignored.
  void shutdown();

  // Whether a request fits an engine's whole KV cache (the same for every engine). Any thread.
  bool fits(std::uint64_t prompt_tokens, std::uint64_t max_tokens) const {
    return schedulers_.front()->fits(prompt_tokens, max_tokens);
  }

  // How many leading blocks of `chain` scheduler `scheduler`'s KV cache holds now (--dp-balance oracle).
  // Thread 0 only: the schedulers are not thread-safe, and thread 0 is the one that changes them.
  std::size_t cached_prefix(unsigned scheduler, std::span<const sim::block_hash> chain) const;

  // --kv-events-port: from now on every engine step that changed an engine's cache publishes one
  // EventBatch (the step's events, in order) when the step ends, as vLLM publishes them after the
  // step's model run; engine e's data_parallel_rank is its index on its port, e % dp. Before run().
  // The engines' caches must record their events (kv_cache_config::record_events).
  void publish_kv_events(kv_event_publisher& publisher, const kv_event_format& format, unsigned dp);

  // vLLM's reset_prefix_cache on scheduler `scheduler` (the admin port's /kv-events/reset): no block stays
  // cached, and AllBlocksCleared is published at once (after the events of the step in flight so far).
  // Thread 0 only.
  void reset_prefix_cache(unsigned scheduler);

  // Frees the blocks a finished `hold` request of scheduler `scheduler` kept (batch_scheduler::release_held):
  // its hold was pulled, expired, or never handed out. Any thread; ignored once shut down.
  void release_held(unsigned scheduler, sim::request_id id);

 private:
  friend class sim_request;
  struct clock_state;

  // Any thread.
  void submit(std::shared_ptr<sim_stream> stream);
  void abort(std::shared_ptr<sim_stream> stream);
  sim::request_id next_id() { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  bool accepting() const { return accepting_.load(std::memory_order_acquire); }

  // Thread 0 only.
  void enqueue(std::shared_ptr<sim_stream> stream);
  void remove(const sim_stream& stream);
  void kick(unsigned clock);
  void arm(unsigned clock);
  void on_step_end(unsigned clock);
  void deliver(const std::vector<sim::token_event>& tokens);
  void publish(const clock_state& clock);
  void collect_kv_events(const clock_state& clock);  // after a step began: its events wait for its end
  void flush_kv_events(unsigned engine);              // one EventBatch of what the engine collected
  sim::sim_time sim_now() const;
  std::chrono::steady_clock::time_point wall_time(sim::sim_time t) const;

  boost::asio::io_context& context_;
  const std::vector<engine_metrics*> engines_;  // [scheduler]
  const double time_scale_;
  const std::uint64_t start_after_;  // --start-after: steps are held until this many requests arrived
  std::uint64_t arrived_ = 0;        // requests submitted so far (thread 0)
  const std::chrono::steady_clock::time_point epoch_;              // simulated time 0
  std::vector<std::unique_ptr<sim::batch_scheduler>> schedulers_;  // [engine]
  std::vector<std::unique_ptr<clock_state>> clocks_;
  std::vector<unsigned> clock_of_engine_;
  std::unordered_map<sim::request_id, std::shared_ptr<sim_stream>> streams_;  // submitted, not finished
  std::vector<sim::token_event> tokens_;                                      // reused by every step
  kv_event_publisher* kv_publisher_ = nullptr;  // with --kv-events-port
  kv_event_format kv_format_;
  unsigned dp_ = 1;
  std::vector<std::vector<sim::cache_event>> kv_pending_;  // [engine]: the events of its step in flight
  std::atomic<sim::request_id> next_id_{1};
  std::atomic<bool> accepting_{true};
};

// A session's simulated request, for the time the session serves it: submitted at construction; at
// destruction the session stops listening and, if the request has not produced all its tokens (the
// client went away, a fault cut it), it is aborted: removed from the queue or the batch. Construct and
// destroy on the session's thread; `waker` is cancelled whenever tokens arrive (every step for
// `stream`, else only at the last token) and must not be waited on by anything else meanwhile.
class sim_request {
 public:
  // `scheduler`: the engine's sim_index. `remote_prefilled`: a decode engine's request whose prompt KV
  // was pulled from a prefill engine; it skips the prefill (batch_scheduler::submit). `hold`: a prefill
  // engine's leg 1, whose blocks stay allocated once it finished, until the function hand_over_hold() returns
  // is called (or, never handed over, until this sim_request goes).
  sim_request(sim_engine& engine, unsigned scheduler, std::uint64_t prompt_tokens,
              sim::chain_builder prompt_chain, std::uint64_t max_tokens, bool stream,
              boost::asio::steady_timer& waker, bool remote_prefilled = false, bool hold = false);
  ~sim_request();
  sim_request(const sim_request&) = delete;
  sim_request& operator=(const sim_request&) = delete;

  const sim_stream& state() const { return *stream_; }

  // Once finished, with `hold`: what frees the held blocks (any thread, once); the caller owns it from now.
  std::function<void()> hand_over_hold();

 private:
  sim_engine& engine_;
  std::shared_ptr<sim_stream> stream_;
  bool handed_over_ = false;
};

}  // namespace dplb::mock
