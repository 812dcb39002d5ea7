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

// A replay asked of a rank's replay socket (vLLM's ROUTER) and not answered whole yet: what the buffer sends
// from `next` up to (not including) `to` is applied as it comes, in order, each as if it had arrived. While
// one is pending, its rank's SUB socket is not read: the live messages after `held` wait in ZMQ's queue (and,
// beyond it, in the publisher's), so that they are applied after the batches replayed before them, and the
// other ranks are read as usual. It ends at the buffer's end marker, at `to`, at a hole, or at `deadline`.
struct event_subscriber::pending_replay {
  replay_purpose why;
  zmq::socket_t dealer;
  std::int64_t next;  // the first number still needed
  std::int64_t to;    // the held message's number
  std::chrono::steady_clock::time_point deadline;
  zmq::message_t held;  // the live message that asked for the replay, applied once it ends
  double held_arrival;
  std::size_t applied = 0;
  bool answered = false;
  bool ended = false;  // the buffer said all it will say (or said something that ends it)
};

struct event_subscriber::connection {
  event_source source;
  zmq::socket_t socket;   // SUB, connected to the publisher
  zmq::socket_t monitor;  // PAIR, receiving the SUB socket's disconnections
  std::chrono::steady_clock::time_point replay_quiet_until{};  // replay_backoff after a replay got no answer
  std::unique_ptr<pending_replay> replay;  // while one is pending, the SUB socket is not read
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
                                                     zmq::socket_t(zmq_->context, zmq::socket_type::pair), {}, nullptr});
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

// Asks c's replay socket for what it still buffers from `from` up to (not including) the number of `held`, the
// live message that showed the need, which is applied once the replay ends (finish_replay). False, with
// `held` untouched, when no replay can be asked: no replay socket, one that did not answer lately, nothing
// in range, or a request that cannot be sent.
bool event_subscriber::begin_replay(connection& c, replay_purpose why, std::int64_t from, std::int64_t to,
                                    zmq::message_t& held) {
  const auto now = std::chrono::steady_clock::now();
  if (c.source.replay.empty() || now < c.replay_quiet_until || from >= to) return false;
  zmq::socket_t dealer(zmq_->context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_payload_bytes));
  dealer.set(zmq::sockopt::rcvhwm, options_.receive_queue);
  dealer.set(zmq::sockopt::ipv6, 1);
  try {
    dealer.connect(c.source.replay);
  } catch (const zmq::error_t&) {
    return false;
  }
  // As a REQ socket would send it: an empty delimiter, then the start (vLLM's ROUTER expects both).
  const auto start = big_endian(from);
  (void)dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  if (!dealer.send(zmq::buffer(start), zmq::send_flags::dontwait)) return false;
  c.replay = std::make_unique<pending_replay>(
      pending_replay{why, std::move(dealer), from, to, now + options_.replay_timeout, std::move(held), now_seconds()});
  return true;
}

// Applies what c's pending replay has received so far (drain_batch messages at most: then the others' turn),
// without waiting; ends it when its answer is complete or cannot go on.
void event_subscriber::read_replay(connection& c) {
  pending_replay& p = *c.replay;
  std::array<zmq::message_t, 3> frames;
  for (std::size_t n = 0; n < drain_batch && !p.ended; ++n) {
    const std::size_t count = receive(p.dealer, frames);
    if (count == 0) return;
    p.answered = true;
    const bool delimited = count == 3 && frames[0].size() == 0;  // as a REQ socket gets it
    const std::size_t first = delimited ? 1 : 0;
    const auto seq = count - first == 2 ? decode_sequence_frame(bytes_of(frames[first])) : std::nullopt;
    if (!seq || *seq < 0 || *seq >= p.to) {  // the end (-1), caught up with the live stream, or garbage
      p.ended = true;
      break;
    }
    if (*seq < p.next) continue;  // before what is needed (a buffer answers from its start)
    if (*seq > p.next && (p.applied > 0 || p.why == replay_purpose::fill_gap)) {
      p.ended = true;  // a hole the buffer no longer holds
      break;
    }
    // Counted before it is applied: whoever sees the batch in the index (through the index's lock) sees the count.
    index_.count_replayed(c.source.rank, 1);
    index_.apply(c.source.rank, decode_event_batch(bytes_of(frames[first + 1])), now_seconds(), /*live=*/false);
    ++p.applied;
    p.next = *seq + 1;
    if (p.next >= p.to) p.ended = true;
  }
  if (p.ended) finish_replay(c);
}

// Ends c's pending replay (complete, cut short or past its deadline), then applies the message that asked for
// it. A catch-up keeps what it applied unless a hole came after it (a removal may be missing); a gap not
// filled whole drops the index, which live events rebuild.
void event_subscriber::finish_replay(connection& c) {
  const std::unique_ptr<pending_replay> p = std::move(c.replay);
  const std::size_t rank = c.source.rank;
  if (!p->answered) {
    c.replay_quiet_until = std::chrono::steady_clock::now() + options_.replay_backoff;
    spdlog::warn("rank {}: the KV-cache events replay socket {} did not answer; not asked again for {} s", rank,
                 c.source.replay, options_.replay_backoff.count() / 1000);
  }
  const bool complete = p->next >= p->to;
  if (p->why == replay_purpose::catch_up) {
    if (!complete && p->applied > 0) index_.clear_rank(rank, reset_reason::gap);
  } else if (!complete) {
    spdlog::warn("rank {}: KV-cache events {}..{} lost and not replayed; its index is dropped and rebuilt from live "
                 "events", rank, p->next, p->to - 1);
    index_.clear_rank(rank, reset_reason::gap);
  }
  index_.apply(rank, decode_event_batch(bytes_of(p->held)), p->held_arrival);
}

void event_subscriber::on_message(connection& c, std::int64_t seq, zmq::message_t& payload) {
  const std::size_t rank = c.source.rank;
  auto& sequence = zmq_->sequences[rank];
  const std::int64_t expected = sequence.expected();
  // Catching up on what an engine buffered before `seq` (its whole history, when it started at 0): what it
  // tells is kept unless a hole leaves a removal unknown.
  using purpose = replay_purpose;
  switch (sequence.observe(seq)) {
    case sequence_tracker::verdict::first:
      if (begin_replay(c, purpose::catch_up, 0, seq, payload)) return;
      break;
    case sequence_tracker::verdict::next:
      break;
    case sequence_tracker::verdict::gap:
      if (begin_replay(c, purpose::fill_gap, expected, seq, payload)) return;
      spdlog::warn("rank {}: KV-cache events {}..{} lost{}; its index is dropped and rebuilt from live events", rank,
                   expected, seq - 1, c.source.replay.empty() ? " (no kv-replay)" : " and not replayed");
      index_.clear_rank(rank, reset_reason::gap);
      break;
    case sequence_tracker::verdict::restart:
      spdlog::info("rank {}: the KV-cache event publisher restarted (sequence {} after {}); its index is dropped",
                   rank, seq, expected - 1);
      index_.clear_rank(rank, reset_reason::restart);
      if (begin_replay(c, purpose::catch_up, 0, seq, payload)) return;
      break;
  }
  index_.apply(rank, decode_event_batch(bytes_of(payload)), now_seconds());
}

void event_subscriber::on_disconnect(connection& c) {
  const std::size_t rank = c.source.rank;
  if (!zmq_->sequences.contains(rank)) return;  // nothing heard from it yet: nothing to forget
  spdlog::info("rank {}: the KV-cache event publisher {} disconnected; its index is dropped until it is heard again",
               rank, c.source.endpoint);
  zmq_->sequences.erase(rank);  // its next message is taken as the first, and caught up on
  c.replay.reset();              // what it would replay, and the message that asked, were the old engine's
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
    auto wait = options_.poll_period;
    const auto now = std::chrono::steady_clock::now();
    for (const auto& c : open) {
      items.push_back({c->monitor.handle(), 0, ZMQ_POLLIN, 0});
      // A rank with a replay pending is read from its replay socket only, until the replay ends.
      items.push_back({c->replay ? c->replay->dealer.handle() : c->socket.handle(), 0, ZMQ_POLLIN, 0});
      if (c->replay) {
        wait = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(c->replay->deadline - now),
                          std::chrono::milliseconds(0), wait);
      }
    }
    kv::poll(items.data(), items.size(), wait);
    for (std::size_t i = 0; i < open.size(); ++i) {
      connection& c = *open[i];
      // The monitor first: a disconnection comes before anything a new publisher sends.
      if ((items[2 * i].revents & ZMQ_POLLIN) != 0) {
        while (receive(c.monitor, event) > 0) on_disconnect(c);
      }
      if (c.replay) {  // (pending since before the poll: a replay begins only below)
        if ((items[2 * i + 1].revents & ZMQ_POLLIN) != 0) read_replay(c);
        if (c.replay && std::chrono::steady_clock::now() >= c.replay->deadline) finish_replay(c);
        continue;
      }
      // (the item is the replay's if the monitor's disconnection just ended one)
      if ((items[2 * i + 1].revents & ZMQ_POLLIN) == 0 || items[2 * i + 1].socket != c.socket.handle()) continue;
      for (std::size_t n = 0; n < drain_batch && !c.replay; ++n) {
        const std::size_t count = receive(c.socket, frames);
        if (count == 0) break;
        const auto seq = count == 3 ? decode_sequence_frame(bytes_of(frames[1])) : std::nullopt;
        if (!seq || *seq < 0) {
          index_.count_unreadable(c.source.rank);
          continue;
        }
        on_message(c, *seq, frames[2]);
      }
    }
  }
}

}  // namespace dplb::kv
