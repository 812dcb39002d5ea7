#pragma once
// Private to the session: the deadlines of a response relay, kept by one timer.

#include <algorithm>
#include <chrono>
#include <memory>

#include "dplb/support/io_types.hpp"

namespace dplb::server {

// The relay's deadlines, without a timer operation per read and per write. A stream is relayed with one
// read and one write per event, and beast::tcp_stream arms and cancels a timer around each of them (a
// timer-queue insertion and removal and a wrapped handler, every time). Here an operation only stores
// its deadline; one timer per relay wakes at the earliest deadline (or every `period` while none is set)
// and closes the socket whose deadline has passed, so that its pending operation fails, as it would
// with tcp_stream's own timeout. `period` is the shorter of the two timeouts, so no deadline is noticed
// more than one period late.
class relay_watchdog : public std::enable_shared_from_this<relay_watchdog> {
 public:
  using clock_type = std::chrono::steady_clock;
  using time_point = clock_type::time_point;

  relay_watchdog(const io::executor& executor, io::socket& upstream, io::socket& client,
                 std::chrono::milliseconds period)
      : timer_(executor), upstream_(upstream), client_(client), period_(period) {}

  void start() { arm(clock_type::now() + period_); }
  void stop() {
    stopped_ = true;
    timer_.cancel();
  }

  void reading(std::chrono::milliseconds timeout) { upstream_deadline_ = clock_type::now() + timeout; }
  void writing(std::chrono::milliseconds timeout) { client_deadline_ = clock_type::now() + timeout; }
  void idle() { upstream_deadline_ = client_deadline_ = time_point::max(); }

 private:
  void arm(time_point at) {
    timer_.expires_at(at);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) { self->expired(ec); });
  }

  void expired(const boost::system::error_code& ec) {
    if (ec || stopped_) return;  // stopped: the sockets may be gone
    const auto now = clock_type::now();
    boost::system::error_code ignored;
    if (now >= upstream_deadline_) {  // the engine fell silent
      upstream_.close(ignored);
      upstream_deadline_ = time_point::max();
    }
    if (now >= client_deadline_) {  // the client stopped reading
      client_.close(ignored);
      client_deadline_ = time_point::max();
    }
    // Never sleep past `period`: a deadline stored after this wake-up (now + a timeout >= period) is then
    // checked in time, however far the other deadline is. And keep watching after a close: the operation
    // it was meant for may have completed just before, and the relay may go on to another one.
    arm(std::min(std::min(upstream_deadline_, client_deadline_), now + period_));
  }

  io::steady_timer timer_;
  io::socket& upstream_;
  io::socket& client_;
  std::chrono::milliseconds period_;
  time_point upstream_deadline_ = time_point::max();
  time_point client_deadline_ = time_point::max();
  bool stopped_ = false;
};

}  // namespace dplb::server
