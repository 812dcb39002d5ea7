#pragma once
// Reads the engines' KV-cache events into the event index, on a thread of its own: a ZMQ SUB socket per
// rank connected to its engine's publisher (vLLM binds one per DP rank; dplb connects), polled together.
// No request worker ever waits on it, and it never waits on a worker.
//
// Staying true to the engines' caches:
//  - Each message carries the publisher's sequence number. The first one seen is taken as it comes (dplb
//    joins a running engine); with a replay socket configured, what the engine still buffers before it is
//    asked for first ("catching up"), so a dplb that starts (or restarts) next to a warm engine knows its
//    cache at once.
//  - A gap (a number skipped: ZMQ drops messages at its high-water mark) asks the replay socket for the
//    missing batches; without one, or when the replay cannot fill the whole gap in time, the rank's index
//    is dropped and rebuilt from the live events (dplb_kv_index_resets_total{reason="gap"}).
//  - A replay is asked without waiting for its answer: the replay socket is polled with the others, the
//    batches it sends are applied as they come, and it ends by its deadline (`replay_timeout`). Meanwhile its
//    rank's live messages wait in ZMQ's queue (they come after the replayed ones), and every other rank is
//    read as usual: a replay socket that never answers delays no other rank.
//  - A number at or below the last one means the publisher restarted (its engine's cache is empty): the
//    rank's index is dropped (reason "restart"), and the new engine's history caught up on as at the start.
//  - The publisher's connection dropping (ZMQ's monitor: the engine stopped or restarted, or the network
//    failed) drops the index too (reason "disconnect"): what comes after may be another engine's, numbered
//    anew from any point. The next message is then taken as the first.
//  - A message that is not three frames, a sequence frame that is not 8 bytes, or a payload that is not an
//    EventBatch is counted (dplb_kv_event_errors_total) and skipped; the rank keeps its index.
// Bounded in bytes: ZMQ_MAXMSGSIZE refuses a frame over the decoder's payload bound (32 MiB) before it is read
// whole, and each socket queues at most `receive_queue` messages (ZMQ_RCVHWM; beyond it ZMQ stops reading the
// connection, and the publisher queues or drops, which shows as a gap): a socket holds at most
// (receive_queue + 1, the one being received) x 32 MiB, 160 MiB with the default of 4. A rank has its SUB
// socket and, while a replay is pending, one DEALER. A message keeps 3 frames at most once read (more are
// dropped), and decodes to at most max_decoded_bytes (64 MiB), one at a time. ZMQ has no bound on the frames
// of one message, and holds a message whole before it can be read: a publisher is trusted not to send an
// endless one, as its backend is trusted. A replay waits at most `replay_timeout` for its answer; a replay
// socket that does not answer at all is not asked again for `replay_backoff`.
//
// Threading contract: the constructor, set_sources(), start() and stop() may be called from any thread;
// everything else happens on the subscriber's thread. `index` outlives the subscriber.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dplb/kv/event_index.hpp"

namespace zmq {
class message_t;
}

namespace dplb::kv {

// Where one rank's events come from.
struct event_source {
  std::size_t rank = 0;
  std::string endpoint;  // "tcp://host:port" of its publisher
  std::string replay;    // of its replay (ROUTER) socket; empty: none

  bool operator==(const event_source&) const = default;
};

struct subscriber_options {
  std::chrono::milliseconds poll_period{50};       // how soon a change of sources or a stop is seen
  std::chrono::milliseconds replay_timeout{1'000};  // the longest wait for one replay's whole answer
  std::chrono::milliseconds replay_backoff{30'000};  // no replay asked of a socket that did not answer, this long
  // Messages per socket (ZMQ_RCVHWM), each up to max_payload_bytes. Small: a queue is held in bytes, and ZMQ
  // stops reading a connection whose queue is full (the publisher keeps what follows, to its own bound).
  int receive_queue = 4;
};

// What a sequence number says about the messages before it. Pure.
class sequence_tracker {
 public:
  enum class verdict {
    first,    // the first message seen
    next,     // the one after the last
    gap,      // some were skipped: expected() .. seq - 1 are missing
    restart,  // at or below the last: the publisher started again
  };
  verdict observe(std::int64_t seq);
  // The number the next message should carry (0 before the first observe; saturated at the largest).
  std::int64_t expected() const {
    return !last_ ? 0 : *last_ == std::numeric_limits<std::int64_t>::max() ? *last_ : *last_ + 1;
  }
  void reset() { last_.reset(); }

 private:
  std::optional<std::int64_t> last_;
};

class event_subscriber {
 public:
  // `run_loop` runs the thread's loop: a supervisor's run_thread, which restarts it after an exception
  // (see support/supervisor.hpp); by default the loop is called once.
  using loop_runner = std::function<void(const std::function<void()>& body,
                                         const std::function<bool(std::chrono::milliseconds)>& pause)>;

  event_subscriber(event_index& index, subscriber_options options = {}, loop_runner run_loop = {});
  ~event_subscriber();
  event_subscriber(const event_subscriber&) = delete;
  event_subscriber& operator=(const event_subscriber&) = delete;

  // The ranks to read from now (a rank not listed is disconnected and its index dropped). Taken up by the
  // thread within one poll period; an unchanged source keeps its socket and its place in the sequence.
  void set_sources(std::vector<event_source> sources);
  // The rank's next message is taken as the first (caught up on from its replay socket): for a rank whose
  // index was dropped from outside (it turned unhealthy).
  void resync(std::size_t rank);
  void start();
  void stop();

 private:
  struct connection;
  struct pending_replay;
  void run();
  void take_up_sources(std::vector<std::unique_ptr<connection>>& open);
  // `payload` is taken (moved into a replay it asks for) or left as it was.
  void on_message(connection& c, std::int64_t seq, zmq::message_t& payload);
  void on_disconnect(connection& c);
  // Replays are asked without waiting for the answer, read as it comes, and ended by their deadline (see the .cpp).
  enum class replay_purpose {
    catch_up,  // what the engine buffered before the first message heard: the buffer may start after `from`
    fill_gap,  // the numbers skipped before the message heard: all of them, from `from`
  };
  bool begin_replay(connection& c, replay_purpose why, std::int64_t from, std::int64_t to, zmq::message_t& held);
  void read_replay(connection& c);
  void finish_replay(connection& c);
  bool pause(std::chrono::milliseconds delay);

  event_index& index_;
  const subscriber_options options_;
  loop_runner run_loop_;
  struct zmq_state;
  std::unique_ptr<zmq_state> zmq_;
  std::mutex mutex_;  // guards wanted_, changed_ and resync_
  std::vector<event_source> wanted_;
  std::vector<std::size_t> resync_;
  bool changed_ = false;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace dplb::kv
