#pragma once
// The deadlines of a worker's sockets, kept by one timer per worker instead of a timer per operation.
// beast::tcp_stream arms a timer around every read and write: a timer-queue insertion and removal under
// the reactor's lock, and a cancelled wait whose handler goes through the event loop once more, several
// times per request. Here an operation only stores its deadline (a clock read, a store and a comparison),
// and the worker's sweeper closes each socket whose deadline has passed, so that its pending operation
// fails as it would with tcp_stream's own timeout (which closes the socket too). The sweeper wakes at the
// earliest deadline it knows of, but never sooner than `period` after its last sweep: a deadline is
// noticed up to one period late, and a worker busy with thousands of them wakes at most once a period.
// The period is a fraction of the shortest timeout configured (period_for), so the error is small against
// the timeout itself. A worker with nothing due soon (idle, or relaying streams whose deadlines are
// minutes away) is not woken at all.
#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "dplb/config/settings.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::server {

class socket_deadline;

class deadline_sweeper {
 public:
  using clock_type = std::chrono::steady_clock;

  deadline_sweeper(const io::executor& executor, std::chrono::milliseconds period);
  ~deadline_sweeper();
  deadline_sweeper(const deadline_sweeper&) = delete;
  deadline_sweeper& operator=(const deadline_sweeper&) = delete;

  void start();  // on the worker's thread
  void stop();
  std::chrono::milliseconds period() const noexcept { return period_; }
  // When the timer is due (time_point::max(): not armed, nothing to do). For tests.
  clock_type::time_point next_sweep() const noexcept { return registry_->next_sweep; }

  // A quarter of the shortest timeout that a deadline here keeps, between 5 ms and 25 ms.
  static std::chrono::milliseconds period_for(const config::settings& settings);

 private:
  friend class socket_deadline;
  // The deadlines outlive the sweeper when the worker is torn down (sessions end with the event loop,
  // after the sweeper is gone): they share the registry, not the sweeper.
  struct registry {
    std::vector<socket_deadline*> deadlines;
    deadline_sweeper* sweeper = nullptr;  // null while stopped
    // When the armed timer fires. A deadline due sooner re-arms it; while stopped this is min(), so that
    // no deadline asks, and during a sweep max(), so that every deadline set then is noted in `asked`.
    clock_type::time_point next_sweep = clock_type::time_point::min();
    clock_type::time_point asked = clock_type::time_point::max();
    bool sweeping = false;

    // The hot path: one comparison, true only when the sweeper sleeps past `at`.
    void sweep_by(clock_type::time_point at) noexcept {
      if (at < next_sweep) wake_sooner(at);
    }
    void wake_sooner(clock_type::time_point at) noexcept;
  };
  void arm_at(clock_type::time_point at);
  void sweep();
  io::steady_timer timer_;
  std::chrono::milliseconds period_;
  std::shared_ptr<registry> registry_;
  clock_type::time_point last_sweep_ = clock_type::time_point::min();
};

// The deadline of the operation in progress on one socket. Registered with the sweeper for its whole
// life (a session's), so that setting and clearing it never allocates.
class socket_deadline {
 public:
  using clock_type = deadline_sweeper::clock_type;

  explicit socket_deadline(deadline_sweeper& sweeper);
  ~socket_deadline();
  socket_deadline(const socket_deadline&) = delete;
  socket_deadline& operator=(const socket_deadline&) = delete;

  // The socket to close when the deadline passes (null: none). Clears the deadline and its expiry.
  void guard(io::socket* socket) noexcept {
    socket_ = socket;
    at_ = clock_type::time_point::max();
    expired_ = false;
  }
  void expires_after(std::chrono::milliseconds timeout) noexcept {
    at_ = clock_type::now() + timeout;
    registry_->sweep_by(at_);
  }
  void expires_never() noexcept { at_ = clock_type::time_point::max(); }
  // Whether the deadline passed and the socket was closed for it: an operation that failed then timed out.
  bool expired() const noexcept { return expired_; }

  // Calls `wake(context)` once, at the first sweep at or after `at`: the deferred start of something that
  // a request finished before then never needs (the session's watch of its client).
  void wake_at(clock_type::time_point at, void (*wake)(void*), void* context) noexcept {
    wake_at_ = at;
    wake_ = wake;
    wake_context_ = context;
    registry_->sweep_by(at);
  }
  void cancel_wake() noexcept { wake_at_ = clock_type::time_point::max(); }

 private:
  friend class deadline_sweeper;
  void check(clock_type::time_point now) noexcept;

  std::shared_ptr<deadline_sweeper::registry> registry_;
  std::size_t index_;  // in registry_->deadlines
  clock_type::time_point at_ = clock_type::time_point::max();
  io::socket* socket_ = nullptr;
  bool expired_ = false;
  clock_type::time_point wake_at_ = clock_type::time_point::max();
  void (*wake_)(void*) = nullptr;
  void* wake_context_ = nullptr;
};

}  // namespace dplb::server
