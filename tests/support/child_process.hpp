#pragma once
// Runs a program of the project (dplb, the mock engine) as a child for an integration test: its stdout
// and stderr are captured through one pipe so the test can await a line ("listening on ...") instead of
// sleeping, and the destructor stops exactly that pid (SIGTERM, then SIGKILL after a grace period).

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace dplb::test {

class child_process {
 public:
  child_process(std::string program, std::vector<std::string> args);
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  // Reads output until a line matches; returns its match, or nullopt at the deadline or when the
  // child exits first. Lines read on the way are kept (see output()).
  std::optional<std::smatch> wait_for_line(const std::regex& pattern, std::chrono::milliseconds deadline);

  // Every line seen so far, for failure messages.
  std::string output() const;

  // Sends a signal and waits (bounded) for the exit; returns the exit status or nullopt.
  std::optional<int> stop(int signal_number, std::chrono::milliseconds deadline = std::chrono::seconds(5));

  pid_t pid() const noexcept { return pid_; }
  bool running();
  // Resident set size now and at its peak, in KiB, from /proc/<pid>/status.
  long rss_kib() const;
  long peak_rss_kib() const;

 private:
  bool read_more(std::chrono::milliseconds budget);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string pending_;              // bytes after the last complete line
  std::vector<std::string> lines_;   // complete lines, in order
  std::size_t scanned_ = 0;          // lines already offered to wait_for_line
  std::optional<int> exit_status_;
};

}  // namespace dplb::test
