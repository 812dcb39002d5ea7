#include "dplb/server/deadline_sweeper.hpp"

#include <algorithm>

namespace dplb::server {

deadline_sweeper::deadline_sweeper(const io::executor& executor, std::chrono::milliseconds period)
    : timer_(executor), period_(period), registry_(std::make_shared<registry>()) {}

deadline_sweeper::~deadline_sweeper() { stop(); }

void deadline_sweeper::start() {
  registry_->stopped = false;
  arm();
}

void deadline_sweeper::stop() {
  registry_->stopped = true;
  timer_.cancel();
}

void deadline_sweeper::arm() {
  timer_.expires_after(period_);
  timer_.async_wait([this, registry = registry_](const boost::system::error_code& ec) {
    if (ec || registry->stopped) return;  // stopped: the sweeper may be gone
    const auto now = clock_type::now();
    // By index: a deadline's check closes a socket or starts an operation, neither of which completes a
    // handler inline, so the list does not change while it is walked.
    for (std::size_t i = 0; i < registry->deadlines.size(); ++i) registry->deadlines[i]->check(now);
    arm();
  });
}

std::chrono::milliseconds deadline_sweeper::period_for(const config::settings& settings) {
  auto shortest = std::min({settings.client_idle_timeout, settings.request_read_timeout,
                            settings.client_write_timeout, settings.upstream_read_timeout});
  if (settings.upstream_first_byte_timeout.count() > 0) {
    shortest = std::min(shortest, settings.upstream_first_byte_timeout);
  }
  // At most 25 ms: the sweep also starts the watch of a proxied request's client (see the session), and
  // an engine must see a client leave well within 100 ms. 40 wake-ups a second cost a worker nothing.
  return std::clamp(shortest / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(25));
}

socket_deadline::socket_deadline(deadline_sweeper& sweeper) : registry_(sweeper.registry_) {
  index_ = registry_->deadlines.size();
  registry_->deadlines.push_back(this);
}

socket_deadline::~socket_deadline() {
  // Swap-remove: the last deadline takes this one's place.
  auto& deadlines = registry_->deadlines;
  deadlines[index_] = deadlines.back();
  deadlines[index_]->index_ = index_;
  deadlines.pop_back();
}

void socket_deadline::check(clock_type::time_point now) noexcept {
  if (now >= wake_at_) {
    // What `wake` starts completes through the event loop, never inline: the sweep's list stays as it is.
    wake_at_ = clock_type::time_point::max();
    wake_(wake_context_);
  }
  if (now < at_) return;
  at_ = clock_type::time_point::max();
  expired_ = true;
  if (socket_) {
    boost::system::error_code ignored;
    socket_->close(ignored);
  }
}

}  // namespace dplb::server
