#include "kv_event_publisher.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <zmq.hpp>

#include "engine_metrics.hpp"
#include "kv_replay_buffer.hpp"

namespace dplb::mock {
namespace {

// vLLM's publisher sets a high-water mark of 100,000 messages: a slow subscriber loses batches only
// after that many (then the PUB socket drops, and the subscriber sees a gap).
constexpr int send_high_water_mark = 100'000;

std::string endpoint(const kv_publisher_config& config, std::uint16_t port) {
  const std::string host = config.ipv6 ? "[" + config.address + "]" : config.address;
  return "tcp://" + host + ":" + std::to_string(port);
}

std::int64_t read_sequence(const zmq::message_t& frame) {
  std::uint64_t v = 0;
  const auto* bytes = static_cast<const unsigned char*>(frame.data());
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | bytes[i];
  return static_cast<std::int64_t>(v);
}

}  // namespace

std::string sequence_frame(std::int64_t seq) {
  std::string frame(8, '\0');
  const auto v = static_cast<std::uint64_t>(seq);
  for (std::size_t i = 0; i < 8; ++i) frame[i] = static_cast<char>(static_cast<std::uint8_t>(v >> (56 - 8 * i)));
  return frame;
}

struct kv_event_publisher::impl {
  struct queued {
    unsigned engine = 0;
    std::int64_t seq = 0;
    std::string payload;
    std::uint64_t events = 0;
  };

  // One engine's sockets and replay buffer: the publisher thread's only.
  struct engine_sockets {
    engine_sockets(zmq::context_t& context, std::size_t buffer_steps)
        : pub(context, zmq::socket_type::pub), buffer(buffer_steps) {}
    zmq::socket_t pub;
    std::optional<zmq::socket_t> replay;
    kv_replay_buffer buffer;
  };

  impl(const kv_publisher_config& c, std::vector<engine_metrics*> m)
      : config(c), metrics(std::move(m)), next_seq(metrics.size(), 0) {
    for (std::size_t e = 0; e < metrics.size(); ++e) {
      auto& s = *engines.emplace_back(std::make_unique<engine_sockets>(context, config.buffer_steps));
      bind(s.pub, config.events_port, e, "kv-events");
      if (config.replay_port != 0) {
        s.replay.emplace(context, zmq::socket_type::router);
        bind(*s.replay, config.replay_port, e, "kv-replay");
      }
    }
    wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd < 0) throw std::runtime_error("kv-events: eventfd failed");
    thread = std::thread([this] { run(); });
  }

  ~impl() {
    stopping.store(true, std::memory_order_release);
    wake();
    if (thread.joinable()) thread.join();
    engines.clear();  // every socket closes (linger 0) before the context terminates
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void bind(zmq::socket_t& socket, std::uint16_t base, std::size_t engine, const char* what) {
    // Shutdown must never wait for a subscriber: unsent messages are dropped at close.
    socket.set(zmq::sockopt::linger, 0);
    if (config.ipv6) socket.set(zmq::sockopt::ipv6, 1);
    socket.set(zmq::sockopt::sndhwm, send_high_water_mark);
    const auto where = endpoint(config, static_cast<std::uint16_t>(base + engine));
    try {
      socket.bind(where);
    } catch (const zmq::error_t& e) {
      throw std::runtime_error(std::string(what) + " of engine " + std::to_string(engine) + ": cannot bind " +
                               where + ": " + e.what());
    }
  }

  void wake() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_fd, &one, sizeof one);
  }

  std::int64_t publish(unsigned engine, std::string payload, std::uint64_t events, std::optional<std::int64_t> seq) {
    std::int64_t used = 0;
    bool accepted = false;
    {
      const std::lock_guard lock(mutex);
      used = seq ? *seq : next_seq[engine];
      next_seq[engine] = used + 1;
      if (queue.size() < config.queue_limit) {
        queue.push_back({engine, used, std::move(payload), events});
        accepted = true;
      }
    }
    if (accepted) wake();
    else metrics[engine]->kv_batches_dropped.fetch_add(1, std::memory_order_relaxed);
    return used;
  }

  // The publisher thread: sends what the queue holds, answers replay requests; sleeps in zmq_poll.
  void run() {
    std::vector<zmq::pollitem_t> items;
    items.push_back({nullptr, wake_fd, ZMQ_POLLIN, 0});
    for (auto& s : engines) {
      if (s->replay) items.push_back({s->replay->handle(), 0, ZMQ_POLLIN, 0});
    }
    std::deque<queued> batch;
    while (!stopping.load(std::memory_order_acquire)) {
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        std::cerr << "dplb-mock-engine: warning: kv-events poll failed: " << e.what() << '\n';
        return;
      }
      if ((items[0].revents & ZMQ_POLLIN) != 0) {
        std::uint64_t ignored = 0;
        [[maybe_unused]] const auto n = ::read(wake_fd, &ignored, sizeof ignored);
        {
          const std::lock_guard lock(mutex);
          batch.swap(queue);
        }
        for (auto& q : batch) send(q);
        batch.clear();
      }
      std::size_t item = 1;
      for (auto& s : engines) {
        if (!s->replay) continue;
        if ((items[item++].revents & ZMQ_POLLIN) != 0) serve_replay(*s);
      }
    }
  }

  void send(queued& q) {
    auto& s = *engines[q.engine];
    const std::string seq = sequence_frame(q.seq);
    // A PUB socket never blocks: past the high-water mark it drops, as vLLM's does.
    s.pub.send(zmq::buffer(config.topic), zmq::send_flags::sndmore);
    s.pub.send(zmq::buffer(seq), zmq::send_flags::sndmore);
    s.pub.send(zmq::buffer(q.payload), zmq::send_flags::none);
    metrics[q.engine]->kv_events_published.fetch_add(q.events, std::memory_order_relaxed);
    s.buffer.push(q.seq, std::move(q.payload));
  }

  // A request is [identity, start] from a DEALER or [identity, "", start] from a REQ (vLLM expects the
  // latter); the answer mirrors its envelope: one message per buffered batch with seq >= start, then the
  // end marker, seq -1 with an empty payload. A malformed request is dropped, as vLLM logs and drops it.
  void serve_replay(engine_sockets& s) {
    auto& socket = *s.replay;
    for (;;) {
      std::vector<zmq::message_t> frames;
      for (;;) {
        zmq::message_t frame;
        if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
        const bool more = frame.more();
        frames.push_back(std::move(frame));
        if (!more) break;
      }
      if (frames.empty()) return;
      const bool delimited = frames.size() == 3 && frames[1].size() == 0;
      if (!(frames.size() == 2 || delimited) || frames.back().size() != 8) continue;
      const std::string identity = frames[0].to_string();
      const auto answer = [&](std::int64_t seq, std::string_view payload) {
        const std::string seq_frame = sequence_frame(seq);
        socket.send(zmq::buffer(identity), zmq::send_flags::sndmore);
        if (delimited) socket.send(zmq::message_t(), zmq::send_flags::sndmore);
        socket.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore);
        socket.send(zmq::buffer(payload), zmq::send_flags::none);
      };
      s.buffer.for_each_since(read_sequence(frames.back()),
                              [&](const kv_replay_buffer::entry& e) { answer(e.seq, e.payload); });
      answer(-1, {});
    }
  }

  const kv_publisher_config config;
  const std::vector<engine_metrics*> metrics;
  zmq::context_t context{1};
  std::vector<std::unique_ptr<engine_sockets>> engines;
  int wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::thread thread;

  std::mutex mutex;  // guards the two below
  std::deque<queued> queue;
  std::vector<std::int64_t> next_seq;  // [engine]
};

kv_event_publisher::kv_event_publisher(const kv_publisher_config& config, std::vector<engine_metrics*> engines)
    : impl_(std::make_unique<impl>(config, std::move(engines))) {}

kv_event_publisher::~kv_event_publisher() = default;

std::int64_t kv_event_publisher::publish(unsigned engine, std::string payload, std::uint64_t events,
                                         std::optional<std::int64_t> seq) {
  return impl_->publish(engine, std::move(payload), events, seq);
}

}  // namespace dplb::mock
