#pragma once
// One connection to Redis, kept up: hiredis's async API driven by an io_context the caller gives (run by
// one thread, the only one that may call this class). Every command has a deadline; past it the caller
// hears an error at once and the connection is dropped and made again, since hiredis 0.14 cannot cancel one
// command and a late reply must not be taken for the next one's. While the connection is down, commands
// fail at once: the caller goes on by its own counts and loses no time waiting.
//
// On each connect, in one pipeline: AUTH (with a password), SELECT (a database other than 0), FUNCTION
// LOAD REPLACE (a library given: a server restarted empty gets it back), or SUBSCRIBE (a subscriber's
// channel). Once they all answered the client is up, and `on_connected` runs before any caller's command
// can be sent on the new connection. Down, it connects again after a backoff that doubles from
// `backoff_min` to `backoff_max`.

#include "dplb/ledger/redis_url.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace dplb::ledger {

// A reply, copied out of hiredis's (RESP2 has no other types).
struct redis_reply {
  enum class kind { nil, integer, string, status, error, array };
  kind type = kind::nil;
  long long integer = 0;
  std::string text;  // string, status and error
  std::vector<redis_reply> elements;
};

// What a command came to: a reply (which may itself be a Redis error), or no reply and why.
struct redis_result {
  bool ok = false;          // a reply came, and it is not an error reply
  redis_reply reply;
  std::string error;        // set when !ok: the error reply's text, a timeout, or the connection's loss
};

struct redis_client_options {
  redis_endpoint endpoint;
  std::chrono::milliseconds timeout{20};            // every command after the connect
  std::chrono::milliseconds connect_timeout{1000};  // the connect and its pipeline, together
  std::chrono::milliseconds backoff_min{100};
  std::chrono::milliseconds backoff_max{1000};
  std::string function_library;   // FUNCTION LOAD REPLACE on every connect (empty: none)
  std::string subscribe_channel;  // a subscriber: SUBSCRIBE on every connect, messages to on_message
  std::string name = "shared state";  // what the log calls this connection
};

class redis_client {
 public:
  using result_handler = std::function<void(const redis_result&)>;

  redis_client(boost::asio::io_context& io, redis_client_options options);
  // Drops the connection; handlers of commands still waiting are not called.
  ~redis_client();
  redis_client(const redis_client&) = delete;
  redis_client& operator=(const redis_client&) = delete;

  // Every callback runs on the io_context's thread, never from inside hiredis: it may send commands.
  // on_connected: up, nothing of the caller's sent yet on this connection. on_disconnected: was up, is
  // down. on_message: a message on the subscribed channel. on_error: a failed command or connect, by op
  // (the caller's name for the command; "connect" for the connect and its pipeline) and reason.
  void on_connected(std::function<void()> f);
  void on_disconnected(std::function<void()> f);
  void on_message(std::function<void(std::string_view)> f);
  void on_error(std::function<void(std::string_view op, std::string_view error)> f);

  // Connects (and keeps connecting). Call once.
  void start();

  // Sends one command; `done` is called exactly once, posted: with the reply, or with an error at once
  // when the client is down, or at the deadline.
  void command(std::string_view op, const std::vector<std::string>& argv, result_handler done);

  // Up: connected, the pipeline answered, commands are sent.
  bool up() const noexcept;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace dplb::ledger
