#include "dplb/support/supervisor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dplb::support {

std::chrono::milliseconds restart_backoff::after_failure(std::chrono::steady_clock::duration ran_for) {
  if (ran_for >= settings_.healthy_run) next_ = settings_.first;
  const auto delay = next_;
  next_ = std::min(next_ * 2, settings_.max);
  return delay;
}

namespace {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

std::chrono::milliseconds supervisor::failed(task t, restart_backoff& backoff, std::exception_ptr error,
                                             std::chrono::steady_clock::duration ran_for) {
  const auto count = errors_[static_cast<std::size_t>(t)].fetch_add(1, std::memory_order_relaxed) + 1;
  const auto delay = backoff.after_failure(ran_for);
  // One line that names the task, for an alert or a grep: "internal error in task accept: ...".
  spdlog::error("internal error in task {}: {}; restarting it in {} ms (failure {} of this task)", name_of(t),
                describe(error), delay.count(), count);
  return delay;
}

void supervisor::run_thread(task t, const std::function<void()>& body,
                            const std::function<bool(std::chrono::milliseconds)>& pause) {
  restart_backoff backoff(backoff_);
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      body();
      return;
    } catch (...) {
      error = std::current_exception();
    }
    if (!pause(failed(t, backoff, std::move(error), std::chrono::steady_clock::now() - started))) return;
  }
}

void log_escaped_exception(std::string_view what, std::exception_ptr error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    spdlog::error("closing a connection after an unexpected error in {}: {}", what, e.what());
  } catch (...) {
    spdlog::error("closing a connection after an unexpected error in {}", what);
  }
}

void arm_faults(std::string_view names) {
  unsigned bits = 0;
  while (!names.empty()) {
    const auto comma = names.find(',');
    const auto name = names.substr(0, comma);
    names.remove_prefix(comma == std::string_view::npos ? names.size() : comma + 1);
    if (name.empty()) continue;
    const auto found = std::ranges::find(task_names, name);
    if (found == task_names.end()) {
      std::string known;
      for (const auto n : task_names) known += (known.empty() ? "" : ", ") + std::string(n);
      throw std::invalid_argument("'" + std::string(name) + "' is no task's name (tasks: " + known + ")");
    }
    bits |= 1u << static_cast<unsigned>(found - task_names.begin());
  }
  detail::armed_faults.fetch_or(bits, std::memory_order_relaxed);
}

void detail::throw_injected_fault(task t) {
  throw std::runtime_error("fault injected by the test hook DPLB_TEST_THROW_ONCE into task " + std::string(name_of(t)));
}

}  // namespace dplb::support
