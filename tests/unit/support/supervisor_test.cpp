// The supervisor of dplb's background tasks: a task that throws is logged with its name, counted, and run
// again after a backoff that doubles up to its cap and starts over after a good run; one that returns is done.

#include <catch2/catch.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "dplb/support/supervisor.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using dplb::support::restart_backoff;
using dplb::support::supervisor;
using dplb::support::task;
using clock_type = std::chrono::steady_clock;

namespace {

// Routes spdlog's default logger into a string for the test's life.
class captured_log {
 public:
  captured_log() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%l %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", std::move(sink)));
  }
  ~captured_log() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream out_;
};

// A task that throws on each of its first `failures` runs, then returns; it notes when each run started.
struct flaky_task {
  int failures;
  std::vector<clock_type::time_point> runs;

  asio::awaitable<void> run() {
    runs.push_back(clock_type::now());
    if (static_cast<int>(runs.size()) <= failures) throw std::runtime_error("boom #" + std::to_string(runs.size()));
    co_return;
  }
};

}  // namespace

TEST_CASE("the restart backoff doubles from its first wait up to its cap", "[supervisor]") {
  restart_backoff backoff;  // 100 ms doubling to 5 s, reset after 10 s
  std::vector<long> waits;
  for (int i = 0; i < 9; ++i) waits.push_back(static_cast<long>(backoff.after_failure(1ms).count()));
  CHECK(waits == std::vector<long>{100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000});
}

TEST_CASE("a run that lasted long enough starts the backoff over", "[supervisor]") {
  restart_backoff backoff({.first = 10ms, .max = 80ms, .healthy_run = 1s});
  CHECK(backoff.after_failure(0ms) == 10ms);
  CHECK(backoff.after_failure(999ms) == 20ms);  // a short run: the next wait doubles
  CHECK(backoff.after_failure(5ms) == 40ms);
  CHECK(backoff.after_failure(1s) == 10ms);  // it ran fine for a while: from the first wait again
  CHECK(backoff.after_failure(5ms) == 20ms);
}

TEST_CASE("a supervised coroutine that throws is logged, counted and run again after the backoff", "[supervisor]") {
  captured_log log;
  supervisor s({.first = 20ms, .max = 40ms, .healthy_run = 10s});
  asio::io_context io;
  flaky_task flaky{.failures = 3, .runs = {}};
  dplb::support::supervise(s, task::health, io.get_executor(), [&] { return flaky.run(); });
  // Runs out of work once the fourth run returns: a task that returns is not started again.
  io.run_for(10s);

  REQUIRE(flaky.runs.size() == 4);
  CHECK(s.errors(task::health) == 3);
  CHECK(s.errors(task::accept) == 0);  // counted against its own task only
  // 20, 40, then 40 ms (the cap) between the runs; never sooner.
  CHECK(flaky.runs[1] - flaky.runs[0] >= 20ms);
  CHECK(flaky.runs[2] - flaky.runs[1] >= 40ms);
  CHECK(flaky.runs[3] - flaky.runs[2] >= 40ms);
  const auto text = log.text();
  CHECK(text.find("error internal error in task health: boom #1; restarting it in 20 ms") != std::string::npos);
  CHECK(text.find("task health: boom #2; restarting it in 40 ms") != std::string::npos);
  CHECK(text.find("task health: boom #3; restarting it in 40 ms (failure 3 of this task)") != std::string::npos);
}

TEST_CASE("a supervised coroutine that returns is not run again", "[supervisor]") {
  supervisor s;
  asio::io_context io;
  flaky_task flaky{.failures = 0, .runs = {}};
  dplb::support::supervise(s, task::pool_sweep, io.get_executor(), [&] { return flaky.run(); });
  io.run_for(10s);
  CHECK(flaky.runs.size() == 1);
  CHECK(s.errors(task::pool_sweep) == 0);
}

TEST_CASE("a restart pending when the event loop goes away is dropped with it", "[supervisor]") {
  captured_log log;
  supervisor s({.first = 1h, .max = 1h, .healthy_run = 1h});
  flaky_task flaky{.failures = 1, .runs = {}};
  {
    asio::io_context io;
    dplb::support::supervise(s, task::admin_accept, io.get_executor(), [&] { return flaky.run(); });
    io.run_for(50ms);  // the run fails; its restart waits an hour
  }  // destroyed with its timer and what it holds (the sanitizer builds check for a leak)
  CHECK(flaky.runs.size() == 1);
  CHECK(s.errors(task::admin_accept) == 1);
}

TEST_CASE("a supervised thread loop is run again after an exception until it returns", "[supervisor]") {
  captured_log log;
  supervisor s({.first = 10ms, .max = 15ms, .healthy_run = 10s});
  int runs = 0;
  std::vector<long> pauses;
  s.run_thread(
      task::access_log,
      [&] {
        if (++runs <= 3) throw std::runtime_error("disk on fire");
      },
      [&](std::chrono::milliseconds delay) {
        pauses.push_back(static_cast<long>(delay.count()));
        return true;
      });
  CHECK(runs == 4);
  CHECK(pauses == std::vector<long>{10, 15, 15});
  CHECK(s.errors(task::access_log) == 3);
  CHECK(log.text().find("internal error in task access_log: disk on fire") != std::string::npos);
}

TEST_CASE("a supervised thread loop ends when its pause says its owner is stopping", "[supervisor]") {
  captured_log log;
  supervisor s;
  int runs = 0;
  s.run_thread(task::access_log, [&] {
    ++runs;
    throw 42;
  }, [](std::chrono::milliseconds) { return false; });
  CHECK(runs == 1);
  CHECK(s.errors(task::access_log) == 1);
  CHECK(log.text().find("task access_log: an exception that is not a std::exception") != std::string::npos);
}

TEST_CASE("the test hook makes each named task throw once, at its fault point", "[supervisor]") {
  using dplb::support::fault_point;
  CHECK_NOTHROW(fault_point(task::accept));  // inert unless armed
  dplb::support::arm_faults("accept,,engine_stats");
  CHECK_THROWS_WITH(fault_point(task::accept), Catch::Contains("into task accept"));
  CHECK_NOTHROW(fault_point(task::accept));  // once only
  CHECK_NOTHROW(fault_point(task::health));  // not named
  CHECK_THROWS_WITH(fault_point(task::engine_stats), Catch::Contains("into task engine_stats"));
  CHECK_NOTHROW(fault_point(task::engine_stats));
}

TEST_CASE("the test hook refuses a name that is no task's and arms nothing then", "[supervisor]") {
  using dplb::support::fault_point;
  CHECK_THROWS_WITH(dplb::support::arm_faults("health,acept"), Catch::Contains("'acept' is no task's name"));
  CHECK_NOTHROW(fault_point(task::health));
}
