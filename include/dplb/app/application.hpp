#pragma once
// Wiring: builds the shared state (backends, balancer, metrics), starts one worker per thread (event
// loop, acceptor, connection pool) and runs until SIGINT or SIGTERM.

#include <functional>
#include <memory>
#include <string>

#include "dplb/config/settings.hpp"

namespace dplb::app {

// Sets up spdlog's default logger ("dplb", to stderr) with the configured level and format.
void configure_logging(const config::settings& settings);

class application {
 public:
  // Where SIGHUP reads the backends from: the configuration parsed again from the same sources (so the
  // config file's backends, unless --backend or DPLB_BACKENDS override them). Throws config::config_error.
  using backend_source = std::function<config::settings()>;

  // Resolves the backends and binds the listening port; throws config::config_error (bad backend) or
  // boost::system::system_error (port in use) at start-up. Without a backend source, SIGHUP is ignored.
  explicit application(config::settings settings, backend_source reload = {});
  ~application();
  application(const application&) = delete;
  application& operator=(const application&) = delete;

  // Serves until a termination signal (or stop()); returns the process exit code.
  int run();

  // Asks run() to return; safe from any thread.
  void stop();

  // The address actually bound (useful with port 0).
  std::string listen_address() const;

 private:
  void drain();
  void schedule_housekeeping();  // once a second on the main thread: memory trimming after surges
  void schedule_retirements();   // five times a second: removed backends whose last request finished
  void await_reload_signal();    // SIGHUP: the backends again from the configuration

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dplb::app
