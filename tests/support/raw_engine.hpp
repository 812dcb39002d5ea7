#pragma once
// A fake engine that writes exactly the bytes a test scripts, at the times it scripts, so that a test
// can put dplb in front of valid-but-unusual HTTP (interim responses, EOF-delimited bodies, stale bytes
// on an idle connection...) that no real server produces on demand. It runs inside the test process on
// 127.0.0.1 with plain blocking sockets, one thread per accepted connection; the destructor shuts every
// socket down and joins every thread, so nothing it started outlives the test.
//
// Each request is parsed just enough to know where it ends (the head, then a body framed by
// Content-Length or chunked coding, trailers included) and recorded; the script then says what to do.
// Tests await what the engine saw (requests, connections, dplb closing a connection, even in a scripted
// pause) with deadlines.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace dplb::test {

struct raw_action {
  enum class kind {
    write,  // send `bytes` as one send call (so bytes after a body arrive in the same segment)
    pause,  // wait `pause` before the next action
    close,  // FIN: shut both directions down and close; the connection ends
    reset,  // RST: SO_LINGER {1, 0} and close; the connection ends
  };
  kind what = kind::write;
  std::string bytes;
  std::chrono::milliseconds pause{0};
};

raw_action write_bytes(std::string bytes);
raw_action pause_for(std::chrono::milliseconds duration);
raw_action close_connection();
raw_action reset_connection();

struct raw_request {
  std::size_t connection = 0;           // 0, 1, 2... in accept order
  std::size_t index_on_connection = 0;  // 0 for the connection's first request
  std::string head;                     // the exact bytes, request line to the blank line included
  std::string body;                     // decoded (chunk framing removed)
  bool chunked = false;
  std::string trailers;                 // a chunked body's trailer lines, as received (empty if none)
  std::chrono::steady_clock::time_point received_at{};

  std::string_view method() const;
  std::string_view target() const;
  // Values of every header line with that name (case-insensitive), in order.
  std::vector<std::string> header_values(std::string_view name) const;
  std::optional<std::string> header(std::string_view name) const;  // the first value
};

// Called once per request, on that connection's thread. After the actions (unless they closed or reset
// the connection) the engine waits for the next request on the same connection.
using raw_script = std::function<std::vector<raw_action>(const raw_request&)>;

class raw_engine {
 public:
  explicit raw_engine(raw_script script);
  ~raw_engine();
  raw_engine(const raw_engine&) = delete;
  raw_engine& operator=(const raw_engine&) = delete;

  std::uint16_t port() const { return port_; }
  std::string url() const;

  std::vector<raw_request> requests() const;
  std::size_t request_count() const;
  std::size_t accepted_count() const;
  // When dplb closed (or reset) that connection while the engine waited for its next request or paused in
  // a script (a pause ends there, and so does the connection); nullopt while it has not.
  std::optional<std::chrono::steady_clock::time_point> peer_closed_at(std::size_t connection) const;
  // Bytes dplb sent that did not complete a request before it closed (empty for a clean close).
  std::string unfinished_bytes(std::size_t connection) const;

  // Each returns whether the condition holds; false means the deadline passed first.
  bool await_requests(std::size_t count, std::chrono::milliseconds deadline);
  bool await_accepted(std::size_t count, std::chrono::milliseconds deadline);
  bool await_peer_close(std::size_t connection, std::chrono::milliseconds deadline);

 private:
  struct connection_state {
    int fd = -1;  // -1 once closed; guarded by mutex_ so that shutting down never touches a reused number
    bool peer_closed = false;
    std::chrono::steady_clock::time_point peer_closed_at{};
    std::string unfinished;
  };

  void accept_loop();
  void serve(std::size_t connection);
  // Runs the actions; returns false when they ended the connection (or the engine is stopping).
  bool perform(std::size_t connection, const std::vector<raw_action>& actions);
  // A scripted pause; returns false, the close recorded, when the peer closes the connection first.
  bool pause_unless_closed(std::size_t connection, int fd, std::chrono::milliseconds pause);
  // Reads until `buffer` holds a whole request; returns nullopt when the peer closed, the engine stops,
  // or (setting `malformed`) the request's framing cannot be read.
  std::optional<raw_request> read_request(int fd, std::string& buffer, bool& malformed);
  bool receive_more(int fd, std::string& buffer);
  void close_fd(std::size_t connection, bool with_reset);
  template <class Pred>
  bool await(std::chrono::milliseconds deadline, Pred pred);

  raw_script script_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::vector<connection_state> connections_;
  std::vector<raw_request> requests_;
  std::vector<std::thread> connection_threads_;
  std::thread accept_thread_;
};

}  // namespace dplb::test
