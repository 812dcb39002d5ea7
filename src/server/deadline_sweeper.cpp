#include "dplb/server/deadline_sweeper.hpp"

#include <algorithm>

namespace dplb::server {

deadline_sweeper::deadline_sweeper(const io::executor& executor, std::chrono::milliseconds period)
    : timer_(executor), period_(period), registry_(std::make_shared<registry>()) {}

deadline_sweeper::~deadline_sweeper() { stop(); }

void deadline_sweeper::start() {
  registry_->sweeper = this;
  registry_->next_sweep = clock_type::time_point::max();  // not armed: the first deadline arms it
  auto earliest = clock_type::time_point::max();
  for (const socket_deadline* deadline : registry_->deadlines) {
    earliest = std::min({earliest, deadline->at_, deadline->wake_at_});
  }
  if (earliest != clock_type::time_point::max()) arm_at(earliest);
}

void deadline_sweeper::stop() {
  registry_->sweeper = nullptr;
  registry_->next_sweep = clock_type::time_point::min();
  timer_.cancel();
}

void deadline_sweeper::registry::wake_sooner(clock_type::time_point at) noexcept {
  if (sweeping) {
    asked = std::min(asked, at);  // the sweep in progress arms the timer when it is done
  } else if (sweeper != nullptr) {
    sweeper->arm_at(at);
  }
}

void deadline_sweeper::arm_at(clock_type::time_point at) {
  // Never sooner than a period after the last sweep: however many deadlines fall due, one sweep per
  // period closes them all.
  at = std::max(at, last_sweep_ + period_);
  if (at >= registry_->next_sweep) return;  // armed for then already (a busy worker's usual case)
  registry_->next_sweep = at;
  // Re-arming cancels the wait in progress, if any; its handler sees operation_aborted and returns.
  timer_.expires_at(at);
  timer_.async_wait([this, registry = registry_](const boost::system::error_code& ec) {
    if (ec || registry->sweeper == nullptr) return;  // cancelled, or stopped: the sweeper may be gone
    sweep();
  });
}

void deadline_sweeper::sweep() {
  const auto now = clock_type::now();
  last_sweep_ = now;
  auto& reg = *registry_;
  reg.next_sweep = clock_type::time_point::max();
  reg.sweeping = true;
  reg.asked = clock_type::time_point::max();
  auto earliest = clock_type::time_point::max();
  // By index: a deadline's check closes a socket or starts an operation, neither of which completes a
  // handler inline, so the list does not change while it is walked. What a check sets on deadlines
  // already walked is noted in `asked`.
  for (std::size_t i = 0; i < reg.deadlines.size(); ++i) {
    socket_deadline& deadline = *reg.deadlines[i];
    deadline.check(now);
    earliest = std::min({earliest, deadline.at_, deadline.wake_at_});
  }
  reg.sweeping = false;
  earliest = std::min(earliest, reg.asked);
  if (earliest != clock_type::time_point::max()) arm_at(earliest);
}

std::chrono::milliseconds deadline_sweeper::period_for(const config::settings& settings) {
  auto shortest = std::min({settings.client_idle_timeout, settings.request_read_timeout,
                            settings.client_write_timeout, settings.upstream_read_timeout});
  if (settings.upstream_first_byte_timeout.count() > 0) {
    shortest = std::min(shortest, settings.upstream_first_byte_timeout);
  }
  // At most 25 ms: the sweep also starts the watch of a proxied request's client (see the session), and
  // an engine must see a client leave well within 100 ms.
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
