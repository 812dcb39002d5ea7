#include "dplb/kv/event_subscriber.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <iterator>
#include <span>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>

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

}  // namespace

sequence_tracker::verdict sequence_tracker::observe(std::int64_t seq) {
  const auto before = last_;
  last_ = seq;
  if (!before) return verdict::first;
  if (seq == *before + 1) return verdict::next;
  if (seq > *before + 1) return verdict::gap;
  return verdict::restart;
}

struct event_subscriber::zmq_state {
  zmq::context_t context{1};
  // Per rank, across the loop's restarts (sockets are opened anew; the sequence is not forgotten, so that
  // what was lost meanwhile shows as a gap).
  std::unordered_map<std::size_t, sequence_tracker> sequences;
  std::condition_variable wake;  // with mutex_: a stop, or sources while there were none
};

struct event_subscriber::connection {
  event_source source;
  zmq::socket_t socket;
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

void event_subscriber::start() {
  if (thread_.joinable()) return;
  stopping_.store(false);
  thread_ = std::thread([this] { run_loop_([this] { run(); }, [this](std::chrono::milliseconds d) { return pause(d); }); });
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
    auto c = std::make_unique<connection>(connection{source, zmq::socket_t(zmq_->context, zmq::socket_type::sub)});
    c->socket.set(zmq::sockopt::linger, 0);
    c->socket.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_payload_bytes));
    c->socket.set(zmq::sockopt::rcvhwm, options_.receive_queue);
    c->socket.set(zmq::sockopt::reconnect_ivl, 100);
    c->socket.set(zmq::sockopt::reconnect_ivl_max, 5'000);
    c->socket.set(zmq::sockopt::subscribe, "");  // every topic: vLLM's default topic is empty
    c->socket.set(zmq::sockopt::ipv6, 1);         // an [IPv6] endpoint, or a name that resolves to one
    try {
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

namespace {

// Applies the batches a replay socket still buffers from `from` up to (not including) `to`, in order, each as
// if it had arrived live. `contiguous`: only a run that starts at `from` and leaves no hole counts; false is
// returned as soon as one is seen. Returns whether every batch of [from, to) was applied.
bool replay_into(zmq::context_t& context, const std::string& endpoint, std::size_t rank, std::int64_t from,
                 std::int64_t to, bool contiguous, std::chrono::milliseconds timeout, event_index& index) {
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(max_payload_bytes));
  dealer.set(zmq::sockopt::ipv6, 1);
  try {
    dealer.connect(endpoint);
  } catch (const zmq::error_t&) {
    return false;
  }
  // As a REQ socket would send it: an empty delimiter, then the start (vLLM's ROUTER expects both).
  const auto start = big_endian(from);
  std::array<zmq::const_buffer, 2> request{zmq::const_buffer(nullptr, 0), zmq::buffer(start)};
  if (!zmq::send_multipart(dealer, request, zmq::send_flags::dontwait)) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::int64_t next = from;
  std::size_t applied = 0;
  std::vector<zmq::message_t> frames;
  while (next < to) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    std::array<zmq::pollitem_t, 1> item{{{dealer.handle(), 0, ZMQ_POLLIN, 0}}};
    if (zmq::poll(item.data(), item.size(), left) == 0) break;
    frames.clear();
    if (!zmq::recv_multipart(dealer, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
    if (frames.size() == 3 && frames.front().size() == 0) frames.erase(frames.begin());  // the delimiter
    if (frames.size() != 2) break;
    const auto seq = decode_sequence_frame(bytes_of(frames[0]));
    if (!seq || *seq < 0 || *seq >= to) break;  // the end (-1), or caught up with the live stream
    if (*seq < next) continue;                   // before what is needed (a buffer answers from its start)
    if (*seq > next && contiguous) break;        // a hole the buffer no longer holds
    index.apply(rank, decode_event_batch(bytes_of(frames[1])), now_seconds());
    ++applied;
    next = *seq + 1;
  }
  if (applied > 0) index.count_replayed(rank, applied);
  return next >= to;
}

}  // namespace

void event_subscriber::run() {
  {
    const std::lock_guard lock(mutex_);
    changed_ = true;  // (re)open every wanted source: a restarted loop starts with no socket
  }
  std::vector<std::unique_ptr<connection>> open;
  std::vector<zmq::pollitem_t> items;
  std::vector<zmq::message_t> frames;
  while (!stopping_.load()) {
    take_up_sources(open);
    if (open.empty()) {
      std::unique_lock lock(mutex_);
      zmq_->wake.wait_for(lock, options_.poll_period, [this] { return stopping_.load() || changed_; });
      continue;
    }
    items.clear();
    for (const auto& c : open) items.push_back({c->socket.handle(), 0, ZMQ_POLLIN, 0});
    if (zmq::poll(items.data(), items.size(), options_.poll_period) == 0) continue;
    for (std::size_t i = 0; i < open.size(); ++i) {
      if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
      connection& c = *open[i];
      for (std::size_t n = 0; n < drain_batch; ++n) {
        frames.clear();
        if (!zmq::recv_multipart(c.socket, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
        const std::size_t rank = c.source.rank;
        // topic, sequence, payload
        const auto seq = frames.size() == 3 ? decode_sequence_frame(bytes_of(frames[1])) : std::nullopt;
        if (!seq || *seq < 0) {
          index_.count_unreadable(rank);
          continue;
        }
        auto& sequence = zmq_->sequences[rank];
        const std::int64_t expected = sequence.expected();
        switch (sequence.observe(*seq)) {
          case sequence_tracker::verdict::first:
            // Joining a running engine: what it still buffers tells what it cached before.
            if (!c.source.replay.empty() && *seq > 0) {
              replay_into(zmq_->context, c.source.replay, rank, 0, *seq, false, options_.replay_timeout, index_);
            }
            break;
          case sequence_tracker::verdict::next:
            break;
          case sequence_tracker::verdict::gap:
            if (c.source.replay.empty() ||
                !replay_into(zmq_->context, c.source.replay, rank, expected, *seq, true, options_.replay_timeout, index_)) {
              spdlog::warn("rank {}: KV-cache events {}..{} lost{}; its index is dropped and rebuilt from live events",
                           rank, expected, *seq - 1, c.source.replay.empty() ? " (no kv-replay)" : " and not replayed");
              index_.clear_rank(rank, reset_reason::gap);
            }
            break;
          case sequence_tracker::verdict::restart:
            spdlog::info("rank {}: the KV-cache event publisher restarted (sequence {} after {}); its index is dropped",
                         rank, *seq, expected - 1);
            index_.clear_rank(rank, reset_reason::restart);
            break;
        }
        index_.apply(rank, decode_event_batch(bytes_of(frames[2])), now_seconds());
      }
    }
  }
}

}  // namespace dplb::kv
