#include "dplb/kv/event_subscriber.hpp"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <unordered_map>
#include <zmq.hpp>

namespace dplb::kv {

namespace {

std::span<const std::byte> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::array<std::byte, 8> big_endian(std::int64_t value) {
  std::array<std::byte, 8> out{};
  auto v = static_cast<std::uint64_t>(value);
  for (std::size_t i = 8; i-- > 0; v >>= 8) out[i] = static_cast<std::byte>(v & 0xff);
  return out;
}

// Messages taken from one socket before the others get their turn.
constexpr std::size_t drain_batch = 256;

// One message of at most `max_frames` frames, without blocking; frames beyond are read and dropped, so that a
// message of a million tiny frames costs no more memory than one of three. Returns how many frames the message
// had (0: none waiting).
template <std::size_t max_frames>
std::size_t receive(zmq::socket_t& socket, std::array<zmq::message_t, max_frames>& frames) {
  std::size_t count = 0;
  zmq::message_t dropped;
  for (;;) {
    zmq::message_t& into = count < max_frames ? frames[count] : dropped;
    if (!socket.recv(into, zmq::recv_flags::dontwait)) return count;  // nothing waiting (only before a first frame)
    ++count;
    if (!into.more()) return count;
  }
}

// zmq::poll, with a signal's interruption (EINTR) taken as a poll that found nothing.
int poll(zmq::pollitem_t* items, std::size_t count, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(items, count, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return 0;
    throw;
  }
}

}  // namespace

sequence_tracker::verdict sequence_tracker::observe(std::int64_t seq) {
  const auto before = last_;
  last_ = seq;
  if (!before) return verdict::first;
  // Both are non-negative (the subscriber refuses negative numbers), so the difference cannot overflow.
  if (seq > *before) return seq - *before == 1 ? verdict::next : verdict::gap;
  return verdict::restart;
}

struct event_subscriber::zmq_state {
  zmq::context_t context{1};
  // Per rank, across the loop's restarts (sockets are opened anew; the sequence is not forgotten, so that
  // what was lost meanwhile shows as a gap).
  std::unordered_map<std::size_t, sequence_tracker> sequences;
  std::condition_variable wake;  // with mutex_: a stop, or sources while there were none
  std::uint64_t monitors = 0;    // names the monitors' inproc endpoints
};

struct event_subscriber::connection {
  event_source source;
  zmq::socket_t socket;   // SUB, connected to the publisher
  zmq::socket_t monitor;  // PAIR, receiving the SUB socket's disconnections
  std::chrono::steady_clock::time_point replay_quiet_until{};  // replay_backoff after a replay got no answer
};

event_subscriber::event_subscriber(event_index& index, subscriber_options options, loop_runner run_loop)
    : index_(index), options_(options), run_loop_(std::move(run_loop)), zmq_(std::make_unique<zmq_state>()) {
  if (!run_loop_) {
    run_loop_ = [](const std::function<void()>& body, const std::function<bool(std::chrono::milliseconds)>& pause) {
      for (;;) {
        try {
          body();
          return;
        } catch (const std::exception& e) {
          spdlog::error("KV-cache events subscriber failed: {}", e.what());
          if (!pause(std::chrono::milliseconds(100))) return;
        }
      }
    };
  }
}

event_subscriber::~event_subscriber() { stop(); }

void event_subscriber::set_sources(std::vector<event_source> sources) {
  std::ranges::sort(sources, {}, &event_source::rank);
  {
    const std::lock_guard lock(mutex_);
    if (sources == wanted_) return;
    wanted_ = std::move(sources);
    changed_ = true;
  }
  zmq_->wake.notify_all();
}

void event_subscriber::resync(std::size_t rank) {
  const std::lock_guard lock(mutex_);
  resync_.push_back(rank);
}

void event_subscriber::start() {
  if (thread_.joinable()) return;
  stopping_.store(false);
  thread_ = std::thread([this] {
    // Signals are the main thread's (Asio's signal_set): one delivered here would only interrupt a poll.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    run_loop_([this] { run(); }, [this](std::chrono::milliseconds d) { return pause(d); });
  });
}

void event_subscriber::stop() {
  {
    const std::lock_guard lock(mutex_);
    stopping_.store(true);
  }
  zmq_->wake.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool event_subscriber::pause(std::chrono::milliseconds delay) {
  std::unique_lock lock(mutex_);
  zmq_->wake.wait_for(lock, delay, [this] { return stopping_.load(); });
  return !stopping_.load();
}

// Opens the sockets of new or changed sources and closes those of the others, dropping the indexes of the
// ranks that lose their source.
void event_subscriber::take_up_sources(std::vector<std::unique_ptr<connection>>& open) {
  std::vector<event_source> wanted;
  {
    const std::lock_guard lock(mutex_);
    for (const auto rank : resync_) zmq_->sequences.erase(rank);
    resync_.clear();
    if (!changed_) return;
    changed_ = false;
    wanted = wanted_;
  }
  std::vector<std::unique_ptr<connection>> kept;
  for (auto& c : open) {
    if (std::ranges::find(wanted, c->source) != wanted.end()) {
      kept.push_back(std::move(c));
      continue;
    }
    spdlog::info("rank {}: KV-cache events from {} no longer read", c->source.rank, c->source.endpoint);
    zmq_->sequences.erase(c->source.rank);
    index_.set_configured(c->source.rank, false);
    index_.clear_rank(c->source.rank, reset_reason::removed);
  }
  for (const auto& source : wanted) {
    if (std::ranges::any_of(kept, [&](const auto& c) { return c->source == source; })) continue;
    auto c = std::make_unique<connection>(connection{source, zmq::socket_t(zmq_->context, zmq::socket_type::sub),
                                                     zmq::socket_t(zmq_->context, zmq::socket_type::pair), {}});
    c->socket.set(zmq::sockopt::linger, 0);
    c->socket.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_payload_bytes));
    c->socket.set(zmq::sockopt::rcvhwm, options_.receive_queue);
    c->socket.set(zmq::sockopt::reconnect_ivl, 100);
    c->socket.set(zmq::sockopt::reconnect_ivl_max, 5'000);
    c->socket.set(zmq::sockopt::subscribe, "");  // every topic: vLLM's default topic is empty
    c->socket.set(zmq::sockopt::ipv6, 1);         // an [IPv6] endpoint, or a name that resolves to one
    const std::string monitor = "inproc://dplb-kv-monitor-" + std::to_string(++zmq_->monitors);
    try {
      if (zmq_socket_monitor(c->socket.handle(), monitor.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) throw zmq::error_t();
      c->monitor.set(zmq::sockopt::linger, 0);
      c->monitor.connect(monitor);
      c->socket.connect(source.endpoint);  // asynchronous: ZMQ resolves, connects and reconnects in the background
    } catch (const zmq::error_t& e) {
      // Only an endpoint ZMQ cannot parse gets here (the configuration checked its form): the rank goes
      // without events rather than the others with it.
      spdlog::error("rank {}: cannot read KV-cache events from {}: {}", source.rank, source.endpoint, e.what());
      continue;
    }
    index_.set_configured(source.rank, true);
    spdlog::info("rank {}: reading KV-cache events from {}{}", source.rank, source.endpoint,
                 source.replay.empty() ? "" : " (replay " + source.replay + ")");
    kept.push_back(std::move(c));
  }
  open = std::move(kept);
}

// Applies the batches c's replay socket (vLLM's ROUTER) still buffers from `from` up to (not including) `to`,
// in order, each as if it had arrived. `from_any_start`: catching up, the buffer may start after `from` (its
// oldest batches are gone), but once it has started there may be no hole. complete: every batch up to `to`
// was applied; nothing: none was (no answer, or nothing buffered in range); partial: some were, and then a hole
// or the deadline came (what was applied may miss a removal: the caller drops the index).
event_subscriber::replay_result event_subscriber::replay(connection& c, std::int64_t from, std::int64_t to,
                                                         bool from_any_start) {
  const auto now = std::chrono::steady_clock::now();
  if (c.source.replay.empty() || now < c.replay_quiet_until || from >= to) return replay_result::nothing;
  zmq::socket_t dealer(zmq_->context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_payload_bytes));
  dealer.set(zmq::sockopt::rcvhwm, options_.receive_queue);
  dealer.set(zmq::sockopt::ipv6, 1);
  try {
    dealer.connect(c.source.replay);
  } catch (const zmq::error_t&) {
    return replay_result::nothing;
  }
  // As a REQ socket would send it: an empty delimiter, then the start (vLLM's ROUTER expects both).
  const auto start = big_endian(from);
  (void)dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  if (!dealer.send(zmq::buffer(start), zmq::send_flags::dontwait)) return replay_result::nothing;
  const auto deadline = now + options_.replay_timeout;
  const std::size_t rank = c.source.rank;
  std::int64_t next = from;
  std::size_t applied = 0;
  bool answered = false;
  std::array<zmq::message_t, 3> frames;
  while (next < to && !stopping_.load()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    std::array<zmq::pollitem_t, 1> item{{{dealer.handle(), 0, ZMQ_POLLIN, 0}}};
    if (kv::poll(item.data(), item.size(), left) == 0) continue;
    std::size_t count = receive(dealer, frames);
    if (count == 0) continue;
    answered = true;
    const bool delimited = count == 3 && frames[0].size() == 0;  // as a REQ socket gets it
    const std::size_t first = delimited ? 1 : 0;
    if (count - first != 2) break;
    const auto seq = decode_sequence_frame(bytes_of(frames[first]));
    if (!seq || *seq < 0 || *seq >= to) break;  // the end (-1), or caught up with the live stream
    if (*seq < next) continue;                   // before what is needed (a buffer answers from its start)
    if (*seq > next && (applied > 0 || !from_any_start)) break;  // a hole the buffer no longer holds
    index_.apply(rank, decode_event_batch(bytes_of(frames[first + 1])), now_seconds(), /*live=*/false);
    ++applied;
    next = *seq + 1;
  }
  if (!answered) {
    c.replay_quiet_until = std::chrono::steady_clock::now() + options_.replay_backoff;
    spdlog::warn("rank {}: the KV-cache events replay socket {} did not answer; not asked again for {} s", rank,
                 c.source.replay, options_.replay_backoff.count() / 1000);
  }
  if (applied > 0) index_.count_replayed(rank, applied);
  if (next >= to) return replay_result::complete;
  return applied == 0 ? replay_result::nothing : replay_result::partial;
}

void event_subscriber::on_message(connection& c, std::int64_t seq, std::span<const std::byte> payload) {
  const std::size_t rank = c.source.rank;
  auto& sequence = zmq_->sequences[rank];
  const std::int64_t expected = sequence.expected();
  // Catching up on what an engine buffered before `seq` (its whole history, when it started at 0): what it
  // tells is kept unless a hole leaves a removal unknown.
  const auto catch_up = [&] {
    if (replay(c, 0, seq, /*from_any_start=*/true) == replay_result::partial) index_.clear_rank(rank, reset_reason::gap);
  };
  switch (sequence.observe(seq)) {
    case sequence_tracker::verdict::first:
      catch_up();
      break;
    case sequence_tracker::verdict::next:
      break;
    case sequence_tracker::verdict::gap:
      if (replay(c, expected, seq, /*from_any_start=*/false) != replay_result::complete) {
        spdlog::warn("rank {}: KV-cache events {}..{} lost{}; its index is dropped and rebuilt from live events", rank,
                     expected, seq - 1, c.source.replay.empty() ? " (no kv-replay)" : " and not replayed");
        index_.clear_rank(rank, reset_reason::gap);
      }
      break;
    case sequence_tracker::verdict::restart:
      spdlog::info("rank {}: the KV-cache event publisher restarted (sequence {} after {}); its index is dropped",
                   rank, seq, expected - 1);
      index_.clear_rank(rank, reset_reason::restart);
      catch_up();
      break;
  }
  index_.apply(rank, decode_event_batch(payload), now_seconds());
}

void event_subscriber::on_disconnect(connection& c) {
  const std::size_t rank = c.source.rank;
  if (!zmq_->sequences.contains(rank)) return;  // nothing heard from it yet: nothing to forget
  spdlog::info("rank {}: the KV-cache event publisher {} disconnected; its index is dropped until it is heard again",
               rank, c.source.endpoint);
  zmq_->sequences.erase(rank);  // its next message is taken as the first, and caught up on
  index_.clear_rank(rank, reset_reason::disconnect);
}

void event_subscriber::run() {
  {
    const std::lock_guard lock(mutex_);
    changed_ = true;  // (re)open every wanted source: a restarted loop starts with no socket
  }
  std::vector<std::unique_ptr<connection>> open;
  std::vector<zmq::pollitem_t> items;
  std::array<zmq::message_t, 3> frames;  // topic, sequence, payload
  std::array<zmq::message_t, 2> event;   // a monitor event: its id and value, then the endpoint
  while (!stopping_.load()) {
    take_up_sources(open);
    if (open.empty()) {
      std::unique_lock lock(mutex_);
      zmq_->wake.wait_for(lock, options_.poll_period, [this] { return stopping_.load() || changed_; });
      continue;
    }
    items.clear();
    for (const auto& c : open) {
      items.push_back({c->monitor.handle(), 0, ZMQ_POLLIN, 0});
      items.push_back({c->socket.handle(), 0, ZMQ_POLLIN, 0});
    }
    if (kv::poll(items.data(), items.size(), options_.poll_period) == 0) continue;
    for (std::size_t i = 0; i < open.size(); ++i) {
      connection& c = *open[i];
      // The monitor first: a disconnection comes before anything a new publisher sends.
      if ((items[2 * i].revents & ZMQ_POLLIN) != 0) {
        while (receive(c.monitor, event) > 0) on_disconnect(c);
      }
      if ((items[2 * i + 1].revents & ZMQ_POLLIN) == 0) continue;
      for (std::size_t n = 0; n < drain_batch; ++n) {
        const std::size_t count = receive(c.socket, frames);
        if (count == 0) break;
        const auto seq = count == 3 ? decode_sequence_frame(bytes_of(frames[1])) : std::nullopt;
        if (!seq || *seq < 0) {
          index_.count_unreadable(c.source.rank);
          continue;
        }
        on_message(c, *seq, bytes_of(frames[2]));
      }
    }
  }
}

}  // namespace dplb::kv
