#pragma once
// The optional access log (--access-log PATH): one JSON object per line for each request dplb answered on
// its public listener. A worker fills an access_entry while it serves the request and formats the line once
// the response is out, then appends it to a shared buffer; a thread of the log's own takes the buffer every
// 100 ms and writes it with one write(2), so a slow disk never stalls an event loop. When the buffer is full
// a line is dropped, and counted (dplb_access_log_dropped_total), rather than waited for.
//
// Why not spdlog's async logger: it hands each line over on its own (a queue slot, a copy, and a wake-up of
// the writing thread per request). Measured with bench/overhead.sh, that cost dplb 18 to 34% of its requests
// per second at 16 to 256 connections; a buffer taken whole every 100 ms costs one append per request.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace dplb::support {
class supervisor;
}

namespace dplb::metrics {

// What one request's line says. Empty strings and empty optionals are written as null.
struct access_entry {
  std::chrono::system_clock::time_point time;  // its head was read
  std::chrono::steady_clock::time_point started;
  std::string method, path, client, model;
  std::string tenant;  // the request's tenant, by name (never its key); empty for dplb's own paths
  std::optional<std::size_t> rank;  // null: dplb answered without an engine
  unsigned status = 0;
  std::uint64_t bytes = 0;                      // response body bytes written to the client
  std::optional<double> ttfb;                   // seconds, pick to the engine's response head
  std::optional<double> duration;               // seconds, pick to the end; else from `started`
  std::optional<std::uint64_t> prompt_tokens;   // the response's usage
  std::optional<std::uint64_t> completion_tokens;
  // A disaggregated request's first leg (rank, status and seconds from its sending to its whole answer),
  // and the X-Request-Id both legs carried. Written only for a request that ran a prefill leg.
  std::optional<std::size_t> prefill_rank;
  unsigned prefill_status = 0;
  std::optional<double> prefill_duration;
  // The X-Request-Id the engines got (both legs of a disaggregated request), unique per request: the client's
  // with dplb's suffix, or one dplb made for a request in two legs; and the client's own, when it sent one.
  std::string request_id;
  std::string client_request_id;

  // What a rank's accounting wrote (its rank, status, times and tokens), for the next leg to write anew.
  void forget_rank_outcome() {
    rank.reset();
    status = 0;
    ttfb.reset();
    duration.reset();
    prompt_tokens.reset();
    completion_tokens.reset();
  }
};

// The line for an entry, without its newline: {"time":"2026-12-04T10:00:00.123Z","rank":0,"method":"POST",
// "path":"/v1/completions","status":200,"bytes":312,"ttfb":0.0123,"duration":0.5,"tokens":30,
// "prompt_tokens":20,"completion_tokens":10,"model":"m","client":"10.0.0.9:51234","tenant":"default"}; a request
// that sent the engines an X-Request-Id adds ,"request_id":"..." (the engines') and ,"client_request_id":"..."
// when the client sent one; a disaggregated cluster's completion, when it ran a prefill leg, ,"prefill_rank":4,"prefill_status":200,
// "prefill_duration":0.2 before the closing brace. `now` ends a duration that was not set.
std::string format_access_line(const access_entry& entry, std::chrono::steady_clock::time_point now);

class access_log {
 public:
  // Opens PATH for appending ("-": standard output) and starts the writing thread, supervised (task
  // access_log: after an exception it writes again, the lines it had taken then lost). Throws
  // std::runtime_error when the file cannot be opened.
  access_log(const std::string& path, support::supervisor& supervisor);
  ~access_log();  // writes out every line handed over, then stops the thread
  access_log(const access_log&) = delete;
  access_log& operator=(const access_log&) = delete;

  // Appends a line for the writing thread: a short critical section (an append to a buffer), never a wait
  // for the disk, never a system call. Never throws: past the buffer's bound the line is dropped and counted.
  void write(std::string&& line) noexcept;
  // Opens the file again at its path (after logrotate moved it away); SIGHUP calls it. The lines written
  // after it go to the new file.
  void reopen();
  // Lines dropped because the writing thread fell behind by more than the buffer holds.
  std::uint64_t dropped() const;

 private:
  int open_file() const;
  void write_loop();
  bool pause_unless_stopping(std::chrono::milliseconds delay);  // false: stopping
  void write_out(std::string_view bytes);

  const std::string path_;
  std::mutex pending_mutex_;
  std::condition_variable wake_;
  std::string pending_;  // lines not yet taken by the writing thread
  bool stopping_ = false;
  std::atomic<std::uint64_t> dropped_{0};
  std::mutex file_mutex_;  // the descriptor, between the writing thread and reopen()
  int fd_ = -1;
  std::thread writer_;
};

}  // namespace dplb::metrics
