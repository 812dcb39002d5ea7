#pragma once
// The KV-cache events' transport, as vLLM's ZmqEventPublisher: per DP engine one ZMQ PUB socket and,
// optionally, one ROUTER socket that replays buffered batches. Every message is three frames: the topic
// (vLLM's default is empty), the sequence number (8 bytes, big-endian, signed; 0, 1, 2, ... per engine)
// and the payload (kv_event_encoder.hpp).
//
// Threading: ZMQ sockets are not thread-safe, so every socket lives on the publisher's own thread. The
// simulation (thread 0) and the admin port hand it batches through a bounded queue; a batch that finds
// the queue full is dropped, its sequence number consumed all the same, so that subscribers see the gap
// that ZMQ's high-water mark would make in vLLM (and it is counted: mock_kv_event_batches_dropped_total).
// ZMQ stays behind a pointer so that the rest of the mock never includes <zmq.hpp>.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dplb::mock {

struct engine_metrics;

struct kv_publisher_config {
  // The address to bind (an IP literal, the mock's resolved --host), and whether it is IPv6.
  std::string address = "127.0.0.1";
  bool ipv6 = false;
  std::uint16_t events_port = 0;  // engine e publishes on events_port + e
  std::uint16_t replay_port = 0;  // engine e replays on replay_port + e; 0 = no replay sockets
  std::string topic;              // the first frame of every message
  std::size_t buffer_steps = 10000;  // batches kept per engine for replay
  std::size_t queue_limit = 65536;   // batches waiting for the publisher thread, all engines together
};

class kv_event_publisher {
 public:
  // Binds every engine's sockets (throws std::exception with a readable message if one cannot be
  // bound) and starts the thread. engines[e] counts engine e's events and drops; they must outlive this.
  kv_event_publisher(const kv_publisher_config& config, std::vector<engine_metrics*> engines);
  // Stops the thread; sockets close without lingering.
  ~kv_event_publisher();
  kv_event_publisher(const kv_event_publisher&) = delete;
  kv_event_publisher& operator=(const kv_event_publisher&) = delete;

  // Any thread. Queues `payload` as engine e's next message and answers its sequence number: the
  // engine's next one, or `seq` if given (numbering then goes on from seq + 1: a test simulating a gap or
  // a restart). `events`: how many events it holds, for the metrics (0 for hand-made payloads).
  std::int64_t publish(unsigned engine, std::string payload, std::uint64_t events,
                       std::optional<std::int64_t> seq = std::nullopt);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// The 8-byte big-endian frame of a sequence number (signed: a replay ends with -1).
std::string sequence_frame(std::int64_t seq);

}  // namespace dplb::mock
