#pragma once
// dplb's long-lived background tasks never die silently. Each is started through supervise() (a coroutine)
// or supervisor::run_thread() (a thread's loop) instead of co_spawn(..., detached), whose handler swallows
// an exception and leaves the task dead without a word. When a run ends with an exception, the supervisor
// logs it with the task's name, counts it (dplb_internal_errors_total{task}), and starts the task again
// after a backoff: 100 ms after its first failure, doubling up to 5 s for each failure that follows soon
// after, and back to 100 ms after a run of 10 s without one. A run that returns is done (its owner stopped
// it): it is not started again. Every task listed here can be restarted safely (docs/operations.md says
// why for each); none of them needs the process to exit.
//
// A test hook, compiled in and inert: arm_faults() (from DPLB_TEST_THROW_ONCE at start-up) makes each named
// task throw once at the fault point of its loop, so that a test can show it logged, counted and working
// again.
//
// Threading contract: every member may be called from any thread.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string_view>

#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/co_spawn.hpp>

namespace dplb::support {

// The supervised tasks, by their `task` label in dplb_internal_errors_total. Stable names: alerts use them.
enum class task : std::uint8_t {
  accept,        // a worker's accept loop on the public listener (one per worker)
  admin_accept,  // the admin API's accept loop
  health,        // the health monitor's probe and ejection-timer loops
  engine_stats,  // the engine-stats poller's read loop
  pool_sweep,    // a worker's upstream connection pool sweep (one per worker)
  access_log,    // the access log's writing thread
  kv_events,     // the KV-cache events subscriber's thread
  model_context,  // the read loop of the engines' /v1/models (each model's max_model_len)
};
inline constexpr std::array<std::string_view, 8> task_names{"accept",     "admin_accept", "health",
                                                            "engine_stats", "pool_sweep", "access_log",
                                                            "kv_events",  "model_context"};
constexpr std::string_view name_of(task t) { return task_names[static_cast<std::size_t>(t)]; }

// When a failed task runs again. Pure: the caller measures how long the failed run lasted.
class restart_backoff {
 public:
  struct settings {
    std::chrono::milliseconds first{100};  // after the first failure
    std::chrono::milliseconds max{5'000};  // doubling up to this
    // A run that lasted this long was a good one: the next failure waits `first` again.
    std::chrono::milliseconds healthy_run{10'000};
  };
  restart_backoff() : restart_backoff(settings{}) {}
  explicit restart_backoff(settings s) : settings_(s), next_(s.first) {}

  // The wait before the next run, after a run that failed after `ran_for`.
  std::chrono::milliseconds after_failure(std::chrono::steady_clock::duration ran_for);

 private:
  settings settings_;
  std::chrono::milliseconds next_;
};

class supervisor {
 public:
  supervisor() : supervisor(restart_backoff::settings{}) {}
  explicit supervisor(restart_backoff::settings backoff) : backoff_(backoff) {}
  supervisor(const supervisor&) = delete;
  supervisor& operator=(const supervisor&) = delete;

  // A run of `t` failed with `error` after `ran_for`: logged (error level) with the task's name, counted, and
  // the wait before its restart returned (from `backoff`, the task's own).
  std::chrono::milliseconds failed(task t, restart_backoff& backoff, std::exception_ptr error,
                                   std::chrono::steady_clock::duration ran_for);
  // The failures of `t` so far: dplb_internal_errors_total{task="<name_of(t)>"}.
  std::uint64_t errors(task t) const { return errors_[static_cast<std::size_t>(t)].load(std::memory_order_relaxed); }
  restart_backoff::settings backoff_settings() const { return backoff_; }

  // A thread's loop: calls body() until it returns. After an exception, the failure is logged and counted,
  // then pause(delay) is called; it waits up to `delay` and returns whether to run body() again (false: the
  // thread's owner is stopping).
  void run_thread(task t, const std::function<void()>& body,
                  const std::function<bool(std::chrono::milliseconds)>& pause);

 private:
  restart_backoff::settings backoff_;
  std::array<std::atomic<std::uint64_t>, task_names.size()> errors_{};
};

namespace detail {

// One supervised coroutine task: what makes a run, and the timer of its restart. Owned by the handlers
// in flight (the run's completion or the restart's wait): destroying the event loop destroys them, and it.
template <class Executor, class Factory>
class supervised_run : public std::enable_shared_from_this<supervised_run<Executor, Factory>> {
 public:
  supervised_run(supervisor& owner, task id, const Executor& executor, Factory make)
      : owner_(owner), id_(id), make_(std::move(make)), backoff_(owner.backoff_settings()), pause_(executor) {}

  void spawn() {
    started_ = std::chrono::steady_clock::now();
    boost::asio::co_spawn(pause_.get_executor(), make_(), [self = this->shared_from_this()](std::exception_ptr error) {
      if (error) self->restart_after(self->owner_.failed(self->id_, self->backoff_, error,
                                                         std::chrono::steady_clock::now() - self->started_));
    });
  }

 private:
  void restart_after(std::chrono::milliseconds delay) {
    pause_.expires_after(delay);
    pause_.async_wait([self = this->shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->spawn();
    });
  }

  supervisor& owner_;
  task id_;
  Factory make_;
  restart_backoff backoff_;
  boost::asio::basic_waitable_timer<std::chrono::steady_clock, boost::asio::wait_traits<std::chrono::steady_clock>,
                                    Executor>
      pause_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace detail

// Runs the coroutine that make() returns (an awaitable<void> of `executor`'s type) on `executor`, under
// `owner`'s supervision: after an exception, make() is called again once the backoff has passed. Instead
// of co_spawn(executor, make(), detached). `make` and what it refers to must outlive the event loop's run.
template <class Executor, class Factory>
void supervise(supervisor& owner, task id, const Executor& executor, Factory make) {
  std::make_shared<detail::supervised_run<Executor, Factory>>(owner, id, executor, std::move(make))->spawn();
}

// The completion handler of a short-lived coroutine that serves one connection: nothing restarts it (the
// connection is gone with it), but an exception that escaped it is logged, naming `what`, instead of being
// swallowed as with detached. `what` must be a literal or otherwise outlive the coroutine.
void log_escaped_exception(std::string_view what, std::exception_ptr error) noexcept;
inline auto logged_on_failure(std::string_view what) {
  return [what](std::exception_ptr error) {
    if (error) log_escaped_exception(what, error);
  };
}

namespace detail {
inline std::atomic<unsigned> armed_faults{0};  // bit i: task i throws at its next fault point
[[noreturn]] void throw_injected_fault(task t);
}  // namespace detail

// The test hook: each task named in `names` (comma-separated task names, as in DPLB_TEST_THROW_ONCE) throws
// once, at its next fault point. Throws std::invalid_argument on a name that is no task's (nothing armed).
void arm_faults(std::string_view names);

// A task's fault point, in its loop: throws std::runtime_error once when the test hook armed the task; a
// relaxed load of one word otherwise.
inline void fault_point(task t) {
  const unsigned bit = 1u << static_cast<unsigned>(t);
  if ((detail::armed_faults.load(std::memory_order_relaxed) & bit) == 0) [[likely]] return;
  if ((detail::armed_faults.fetch_and(~bit, std::memory_order_relaxed) & bit) != 0) detail::throw_injected_fault(t);
}

}  // namespace dplb::support
