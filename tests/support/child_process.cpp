#include "child_process.hpp"

#include "timing_slack.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace dplb::test {

using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

child_process::child_process(std::string program, std::vector<std::string> args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> argv;
  argv.push_back(program.data());
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error("cannot start " + program + ": " + std::strerror(rc));
  }
  out_fd_ = fds[0];
}

child_process::~child_process() {
  if (pid_ > 0 && !exit_status_) stop(SIGTERM);
  if (pid_ > 0 && !exit_status_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

bool child_process::read_more(milliseconds budget) {
  pollfd p{out_fd_, POLLIN, 0};
  const int ready = poll(&p, 1, static_cast<int>(budget.count()));
  if (ready <= 0) return false;
  char chunk[4096];
  const ssize_t n = read(out_fd_, chunk, sizeof chunk);
  if (n <= 0) return false;  // EOF: the child closed its output (exited)
  pending_.append(chunk, static_cast<std::size_t>(n));
  std::size_t newline;
  while ((newline = pending_.find('\n')) != std::string::npos) {
    lines_.push_back(pending_.substr(0, newline));
    pending_.erase(0, newline + 1);
  }
  return true;
}

std::optional<std::smatch> child_process::wait_for_line(const std::regex& pattern, milliseconds deadline) {
  const auto until = steady::now() + scaled(deadline);
  for (;;) {
    for (; scanned_ < lines_.size(); ++scanned_) {
      std::smatch m;
      if (std::regex_search(lines_[scanned_], m, pattern)) {
        ++scanned_;
        return m;
      }
    }
    const auto left = std::chrono::duration_cast<milliseconds>(until - steady::now());
    if (left <= milliseconds(0)) return std::nullopt;
    if (!read_more(left) && !running()) return std::nullopt;
  }
}

std::string child_process::output() const {
  std::string all;
  for (const auto& l : lines_) all += l + "\n";
  return all + pending_;
}

bool child_process::running() {
  if (exit_status_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

std::optional<int> child_process::stop(int signal_number, milliseconds deadline) {
  if (!running()) return exit_status_;
  kill(pid_, signal_number);
  const auto until = steady::now() + scaled(deadline);
  while (steady::now() < until) {
    // Drain output so a child blocked on a full pipe can still exit.
    read_more(milliseconds(10));
    if (!running()) return exit_status_;
  }
  return std::nullopt;
}

namespace {
long status_field_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}
}  // namespace

long child_process::rss_kib() const { return status_field_kib(pid_, "VmRSS"); }
long child_process::peak_rss_kib() const { return status_field_kib(pid_, "VmHWM"); }

}  // namespace dplb::test
