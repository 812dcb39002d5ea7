#include "dplb/metrics/access_log.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <iterator>
#include <stdexcept>

#include "dplb/support/supervisor.hpp"

namespace dplb::metrics {

namespace {

// Lines waiting for the writing thread at most, in bytes: at ~300 bytes a line, about 28,000 lines, several
// seconds of an LLM deployment's request rate. Beyond it lines are dropped (and counted), never waited for.
constexpr std::size_t max_pending_bytes = 8u << 20;
// How often the writing thread takes the lines written meanwhile: one write(2) per period, whatever the rate.
constexpr auto write_period = std::chrono::milliseconds(100);

void append_rfc3339_millis(std::string& out, std::chrono::system_clock::time_point t) {
  const auto since_epoch = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(since_epoch.count() / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  fmt::format_to(std::back_inserter(out), "\"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z\"", utc.tm_year + 1900,
                 utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, since_epoch.count() % 1000);
}

// The length of the valid UTF-8 sequence at s[i], or 0 if there is none (overlong forms, surrogates and
// code points past U+10FFFF are invalid, as RFC 3629 says).
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  std::size_t n = 0;
  unsigned lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return 0;
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return n;
}

// A JSON string: quotes, backslashes and control characters escaped; bytes that are not UTF-8 become U+FFFD.
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (const std::size_t n = utf8_sequence(s, i)) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    } else {
      out += "\\ufffd";
    }
    ++i;
  }
  out += '"';
}

void append_text_or_null(std::string& out, const std::string& s) {
  if (s.empty()) out += "null";
  else append_json_string(out, s);
}

// Seconds, to the microsecond: enough for a log, and short.
void append_seconds(std::string& out, double s) {
  fmt::format_to(std::back_inserter(out), "{}", std::round(s * 1e6) / 1e6);
}

template <class T>
void append_number_or_null(std::string& out, const std::optional<T>& v) {
  if (v) fmt::format_to(std::back_inserter(out), "{}", *v);
  else out += "null";
}

}  // namespace

std::string format_access_line(const access_entry& e, std::chrono::steady_clock::time_point now) {
  std::string out;
  out.reserve(320);
  out += "{\"time\":";
  append_rfc3339_millis(out, e.time);
  out += ",\"rank\":";
  append_number_or_null(out, e.rank);
  out += ",\"method\":";
  append_text_or_null(out, e.method);
  out += ",\"path\":";
  append_text_or_null(out, e.path);
  fmt::format_to(std::back_inserter(out), ",\"status\":{},\"bytes\":{},\"ttfb\":", e.status, e.bytes);
  if (e.ttfb) append_seconds(out, *e.ttfb);
  else out += "null";
  out += ",\"duration\":";
  append_seconds(out, e.duration ? *e.duration : std::chrono::duration<double>(now - e.started).count());
  std::optional<std::uint64_t> tokens;
  if (e.prompt_tokens || e.completion_tokens) tokens = e.prompt_tokens.value_or(0) + e.completion_tokens.value_or(0);
  out += ",\"tokens\":";
  append_number_or_null(out, tokens);
  out += ",\"prompt_tokens\":";
  append_number_or_null(out, e.prompt_tokens);
  out += ",\"completion_tokens\":";
  append_number_or_null(out, e.completion_tokens);
  out += ",\"model\":";
  append_text_or_null(out, e.model);
  out += ",\"client\":";
  append_text_or_null(out, e.client);
  out += ",\"tenant\":";
  append_text_or_null(out, e.tenant);
  if (!e.request_id.empty()) {
    out += ",\"request_id\":";
    append_text_or_null(out, e.request_id);
  }
  if (!e.client_request_id.empty()) {
    out += ",\"client_request_id\":";
    append_text_or_null(out, e.client_request_id);
  }
  if (e.prefill_rank) {
    out += ",\"prefill_rank\":";
    append_number_or_null(out, e.prefill_rank);
    fmt::format_to(std::back_inserter(out), ",\"prefill_status\":{},\"prefill_duration\":", e.prefill_status);
    if (e.prefill_duration) append_seconds(out, *e.prefill_duration);
    else out += "null";
  }
  out += '}';
  return out;
}

access_log::access_log(const std::string& path, support::supervisor& supervisor) : path_(path) {
  fd_ = path == "-" ? STDOUT_FILENO : open_file();
  writer_ = std::thread([this, &supervisor] {
    supervisor.run_thread(support::task::access_log, [this] { write_loop(); },
                          [this](std::chrono::milliseconds delay) { return pause_unless_stopping(delay); });
  });
}

access_log::~access_log() {
  {
    std::lock_guard lock(pending_mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  writer_.join();  // it writes what is pending before it returns
  if (fd_ != STDOUT_FILENO) ::close(fd_);
}

int access_log::open_file() const {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) throw std::runtime_error("cannot open the access log " + path_ + ": " + std::strerror(errno));
  return fd;
}

void access_log::write(std::string&& line) noexcept {
  std::lock_guard lock(pending_mutex_);
  if (pending_.size() + line.size() + 1 > max_pending_bytes) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    pending_ += line;
    pending_ += '\n';
  } catch (...) {  // out of memory: the line is lost, the request is not
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

void access_log::reopen() {
  if (fd_ == STDOUT_FILENO) return;
  const int fresh = open_file();
  std::lock_guard lock(file_mutex_);
  ::close(fd_);
  fd_ = fresh;
}

std::uint64_t access_log::dropped() const { return dropped_.load(std::memory_order_relaxed); }

void access_log::write_loop() {
  std::string batch;
  std::unique_lock lock(pending_mutex_);
  for (;;) {
    wake_.wait_for(lock, write_period, [&] { return stopping_; });
    support::fault_point(support::task::access_log);  // before the lines are taken: none is lost
    const bool last = stopping_;
    batch.clear();
    batch.swap(pending_);  // the workers go on appending to an empty buffer at once
    lock.unlock();
    write_out(batch);
    lock.lock();
    if (last && pending_.empty()) return;
  }
}

// Between a failed run of the writing thread and the next. When the log is stopping, the thread ends at
// once: the lines still pending then are lost, as they would be with a failing disk.
bool access_log::pause_unless_stopping(std::chrono::milliseconds delay) {
  std::unique_lock lock(pending_mutex_);
  return !wake_.wait_for(lock, delay, [&] { return stopping_; });
}

void access_log::write_out(std::string_view bytes) {
  std::lock_guard lock(file_mutex_);
  while (!bytes.empty()) {
    const auto n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk or a closed descriptor: the lines are lost, the proxy goes on
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace dplb::metrics
