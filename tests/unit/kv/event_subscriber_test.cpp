// The KV-cache event subscriber against real ZMQ sockets in this process (a PUB as vLLM binds it, and a
// ROUTER answering replays as vLLM's does): events reach the index, a sequence gap is replayed or else drops
// the rank's index, a publisher restart drops it, garbage is counted and skipped, and a subscriber that joins
// late catches up from the replay buffer. Every wait is on an observable count, bounded.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "dplb/kv/event_index.hpp"
#include "dplb/kv/event_subscriber.hpp"
#include "msgpack_writer.hpp"

using namespace dplb::kv;
using dplb::kv::test::msgpack_writer;

namespace {

constexpr std::uint32_t block = 4;

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds deadline = std::chrono::seconds(5)) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::string big_endian(std::int64_t value) {
  std::string out(8, '\0');
  auto v = static_cast<std::uint64_t>(value);
  for (int i = 7; i >= 0; --i, v >>= 8) out[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

std::vector<token_id> tokens(std::size_t blocks, token_id first) {
  std::vector<token_id> t(blocks * block);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// An EventBatch (array encoding) of one BlockStored: `toks` under integer hashes first_key, first_key + 1, ...
std::string stored_batch(const std::vector<token_id>& toks, std::uint64_t first_key) {
  msgpack_writer w;
  w.array(2).float64(1.0e9).array(1);
  w.array(8).str("BlockStored").array(static_cast<std::uint32_t>(toks.size() / block));
  for (std::size_t i = 0; i < toks.size() / block; ++i) w.uint(first_key + i);
  w.nil().uints(toks).uint(block).nil().str("GPU").nil();
  const auto bytes = w.bytes();
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::string removed_batch(std::uint64_t key) {
  msgpack_writer w;
  w.array(2).float64(1.0e9).array(1).array(3).str("BlockRemoved").array(1).uint(key).str("GPU");
  const auto bytes = w.bytes();
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::vector<chain_hash> chain_of(const std::vector<token_id>& toks) {
  std::vector<chain_hash> out;
  prompt_chain(toks, block, chain_seed({}), {}, 1 << 20, out);
  return out;
}

// One engine's publisher as vLLM runs it: a PUB bound on an ephemeral loopback port, numbering its messages,
// keeping what it sent for replays; and, optionally, its replay ROUTER served on a thread of its own.
class fake_publisher {
 public:
  explicit fake_publisher(zmq::context_t& context) : context_(context), pub_(context, zmq::socket_type::pub) {
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind("tcp://127.0.0.1:*");
    endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
  }

  // The engine restarts: its socket closes, a new one binds the same endpoint, numbering from `seq`.
  void restart(std::int64_t seq) {
    pub_.close();
    pub_ = zmq::socket_t(context_, zmq::socket_type::pub);
    pub_.set(zmq::sockopt::linger, 0);
    // ZMQ closes the old listener on its I/O thread: the port is free again a moment later.
    REQUIRE(eventually([&] {
      try {
        pub_.bind(endpoint_);
        return true;
      } catch (const zmq::error_t&) {
        return false;
      }
    }));
    forget_history(seq);
  }
  // A new engine's numbering and replay buffer (its socket kept, as if its restart went unseen).
  void forget_history(std::int64_t seq) {
    next_ = seq;
    const std::lock_guard lock(mutex_);
    buffer_.clear();
  }
  ~fake_publisher() {
    serving_ = false;
    if (replay_thread_.joinable()) replay_thread_.join();
  }

  const std::string& endpoint() const { return endpoint_; }

  // Sends `payload` under the next sequence number (or `seq`, from which numbering goes on); `lost` keeps it
  // in the replay buffer without sending it (a message ZMQ dropped).
  std::int64_t send(const std::string& payload, std::optional<std::int64_t> seq = std::nullopt, bool lost = false) {
    if (seq) next_ = *seq;
    const std::int64_t n = next_++;
    {
      const std::lock_guard lock(mutex_);
      buffer_.emplace_back(n, payload);
    }
    if (!lost) {
      const std::string sequence = big_endian(n);  // alive until sent: zmq::buffer only points at it
      std::array<zmq::const_buffer, 3> frames{zmq::buffer(topic_), zmq::buffer(sequence), zmq::buffer(payload)};
      REQUIRE(zmq::send_multipart(pub_, frames));
    }
    return n;
  }
  void send_frames(const std::vector<std::string>& frames) {
    std::vector<zmq::const_buffer> parts;
    for (const auto& f : frames) parts.push_back(zmq::buffer(f));
    REQUIRE(zmq::send_multipart(pub_, parts));
  }

  // Serves replays on an ephemeral port: [id, "", start] -> [id, "", seq, payload]... then [id, "", -1, ""].
  std::string serve_replays(zmq::context_t& context) {
    zmq::socket_t router(context, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:*");
    std::string endpoint = router.get(zmq::sockopt::last_endpoint);
    replay_thread_ = std::thread([this, router = std::move(router)]() mutable {
      while (serving_) {
        std::array<zmq::pollitem_t, 1> item{{{router.handle(), 0, ZMQ_POLLIN, 0}}};
        if (zmq::poll(item.data(), 1, std::chrono::milliseconds(10)) == 0) continue;
        std::vector<zmq::message_t> request;
        if (!zmq::recv_multipart(router, std::back_inserter(request)) || request.size() != 3) continue;
        std::int64_t start = 0;
        for (const auto b : request[2].to_string()) start = (start << 8) | static_cast<unsigned char>(b);
        ++replays_;
        const std::lock_guard lock(mutex_);
        for (const auto& [seq, payload] : buffer_) {
          if (seq < start) continue;
          const std::string sequence = big_endian(seq);
          std::array<zmq::const_buffer, 4> answer{zmq::buffer(request[0].data(), request[0].size()),
                                                  zmq::const_buffer(nullptr, 0), zmq::buffer(sequence),
                                                  zmq::buffer(payload)};
          (void)zmq::send_multipart(router, answer);
        }
        const auto end = big_endian(-1);
        std::array<zmq::const_buffer, 4> last{zmq::buffer(request[0].data(), request[0].size()),
                                              zmq::const_buffer(nullptr, 0), zmq::buffer(end), zmq::const_buffer(nullptr, 0)};
        (void)zmq::send_multipart(router, last);
      }
    });
    return endpoint;
  }
  int replays() const { return replays_.load(); }

 private:
  zmq::context_t& context_;
  zmq::socket_t pub_;
  std::string endpoint_;
  std::string topic_;
  std::int64_t next_ = 0;
  std::mutex mutex_;
  std::vector<std::pair<std::int64_t, std::string>> buffer_;
  std::atomic<bool> serving_{true};
  std::atomic<int> replays_{0};
  std::thread replay_thread_;
};

struct fixture {
  zmq::context_t context{1};
  event_index index{1'000, 8};
  fake_publisher publisher{context};
  std::optional<event_subscriber> subscriber;

  void subscribe(std::string replay = {}) {
    subscriber.emplace(index, subscriber_options{.poll_period = std::chrono::milliseconds(5),
                                                 .replay_timeout = std::chrono::milliseconds(2'000),
                                                 .replay_backoff = std::chrono::milliseconds(30'000),
                                                 .receive_queue = 1'000});
    subscriber->set_sources({{0, publisher.endpoint(), std::move(replay)}});
    subscriber->start();
  }
  // ZMQ's slow joiner: what is published before the subscription reaches the publisher is lost. Publishes a
  // harmless removal until one arrives.
  void join() {
    const auto before = feed().events.load();
    REQUIRE(eventually([&] {
      publisher.send(removed_batch(999'999));
      return eventually([&] { return feed().events.load() > before; }, std::chrono::milliseconds(20));
    }));
  }
  // Publishes `toks` as stored under keys first_key, ... and waits until the index matches all of them.
  void store(const std::vector<token_id>& toks, std::uint64_t first_key) {
    publisher.send(stored_batch(toks, first_key));
    REQUIRE(eventually([&] { return matched(toks) == toks.size() / block; }));
  }
  const rank_feed& feed() const { return *index.feed(0); }
  std::uint32_t matched(const std::vector<token_id>& toks) const {
    std::vector<std::uint32_t> m;
    index.match(chain_of(toks), 1, m);
    return m[0];
  }
  std::uint64_t resets(reset_reason why) const { return feed().resets[static_cast<std::size_t>(why)].load(); }
};

}  // namespace

TEST_CASE("subscriber: stored events reach the index and removals take blocks away", "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  CHECK(f.feed().configured.load());
  const auto prompt = tokens(3, 500);
  f.store(prompt, 10);
  CHECK(f.feed().blocks.load() == 3);
  f.publisher.send(removed_batch(12));  // the last block
  REQUIRE(eventually([&] { return f.matched(prompt) == 2; }));
  CHECK(f.resets(reset_reason::gap) == 0);
  CHECK(f.feed().errors.load() == 0);
}

TEST_CASE("subscriber: a gap without a replay socket drops the rank's index, then live events rebuild it", "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  const auto before = tokens(2, 100);
  f.store(before, 20);
  f.publisher.send(removed_batch(20), std::nullopt, /*lost=*/true);  // what it said is lost
  const auto after = tokens(2, 200);
  f.store(after, 30);
  CHECK(f.resets(reset_reason::gap) == 1);
  CHECK(f.matched(before) == 0);  // dropped: its removal may have been the lost message
}

TEST_CASE("subscriber: a gap is filled from the replay socket, in order, and nothing is dropped", "[kv][subscriber]") {
  fixture f;
  const auto replay = f.publisher.serve_replays(f.context);
  f.subscribe(replay);
  f.join();
  const auto kept = tokens(2, 100);
  f.store(kept, 20);
  // (join() may have caught up from the replay socket already: what it sends from here is counted)
  const auto replayed_before = f.feed().replayed.load();
  const auto replays_before = f.publisher.replays();
  const auto lost = tokens(2, 300);
  f.publisher.send(stored_batch(lost, 40), std::nullopt, /*lost=*/true);
  f.publisher.send(removed_batch(21), std::nullopt, /*lost=*/true);
  const auto live = tokens(1, 600);
  f.store(live, 60);
  CHECK(f.resets(reset_reason::gap) == 0);
  CHECK(f.feed().replayed.load() - replayed_before == 2);
  CHECK(f.matched(lost) == 2);  // the first lost batch, replayed
  CHECK(f.matched(kept) == 1);  // the second, replayed: its removal applied after it
  CHECK(f.publisher.replays() - replays_before == 1);
}

TEST_CASE("subscriber: a publisher restart (the sequence goes back) drops the rank's index", "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  const auto old_prompt = tokens(2, 100);
  f.store(old_prompt, 20);
  const auto fresh = tokens(2, 700);
  f.publisher.send(stored_batch(fresh, 70), /*seq=*/0);
  REQUIRE(eventually([&] { return f.matched(fresh) == 2; }));
  CHECK(f.resets(reset_reason::restart) == 1);
  CHECK(f.matched(old_prompt) == 0);
}

TEST_CASE("subscriber: garbage is counted and skipped, and the rank keeps its index", "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  const auto prompt = tokens(2, 100);
  f.store(prompt, 20);
  const auto errors = f.feed().errors.load();
  f.publisher.send("not msgpack at all");                        // a payload that is no EventBatch
  f.publisher.send_frames({"", "short", "x"});                   // a sequence frame that is not 8 bytes
  f.publisher.send_frames({"only two frames", big_endian(99)});  // not three frames (send_frames keeps them alive)
  msgpack_writer unknown;
  unknown.array(2).float64(1.0e9).array(1).array(2).str("BlockTeleported").uint(1);
  const auto bytes = unknown.bytes();
  f.publisher.send({reinterpret_cast<const char*>(bytes.data()), bytes.size()});  // an unknown event type
  REQUIRE(eventually([&] { return f.feed().errors.load() == errors + 4; }));
  const auto more = tokens(1, 900);
  f.store(more, 90);
  CHECK(f.matched(prompt) == 2);
  CHECK(f.resets(reset_reason::gap) == 0);
  CHECK(f.resets(reset_reason::restart) == 0);
}

TEST_CASE("subscriber: joining a running engine, it catches up on what the replay buffer holds", "[kv][subscriber]") {
  fixture f;
  const auto replay = f.publisher.serve_replays(f.context);
  const auto early = tokens(2, 100);
  f.publisher.send(stored_batch(early, 20), std::nullopt, /*lost=*/true);  // before dplb was there
  f.subscribe(replay);
  f.join();
  REQUIRE(eventually([&] { return f.matched(early) == 2; }));
  CHECK(f.resets(reset_reason::gap) == 0);
  CHECK(f.feed().replayed.load() >= 1);
}

TEST_CASE("subscriber: a rank that loses its source is disconnected and its index dropped", "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  const auto prompt = tokens(2, 100);
  f.store(prompt, 20);
  f.subscriber->set_sources({});
  REQUIRE(eventually([&] { return !f.feed().configured.load(); }));
  CHECK(f.matched(prompt) == 0);
  CHECK(f.resets(reset_reason::removed) == 1);
  CHECK_FALSE(f.index.any_configured());
}

TEST_CASE("sequence tracker: first, next, gap and restart", "[kv][subscriber]") {
  sequence_tracker t;
  CHECK(t.observe(5) == sequence_tracker::verdict::first);
  CHECK(t.observe(6) == sequence_tracker::verdict::next);
  CHECK(t.expected() == 7);
  CHECK(t.observe(9) == sequence_tracker::verdict::gap);
  CHECK(t.observe(9) == sequence_tracker::verdict::restart);
  CHECK(t.observe(0) == sequence_tracker::verdict::restart);
  CHECK(t.observe(1) == sequence_tracker::verdict::next);
}

TEST_CASE("subscriber: a publisher that disconnects drops the rank's index, and its successor is heard anew",
          "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  const auto old_prompt = tokens(2, 100);
  f.store(old_prompt, 20);
  // The new engine numbers from a point that looks like the next one: only the disconnection tells.
  f.publisher.restart(f.publisher.send(removed_batch(999'998), std::nullopt, /*lost=*/true) + 1);
  REQUIRE(eventually([&] { return f.resets(reset_reason::disconnect) == 1; }));
  CHECK(f.matched(old_prompt) == 0);
  f.join();
  const auto fresh = tokens(2, 700);
  f.store(fresh, 70);
  CHECK(f.resets(reset_reason::gap) == 0);
  CHECK(f.resets(reset_reason::restart) == 0);
}

TEST_CASE("subscriber: a message of more than three frames is counted and dropped whole", "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  const auto errors = f.feed().errors.load();
  std::vector<std::string> frames{"", big_endian(1'000), stored_batch(tokens(1, 5), 1)};
  for (int i = 0; i < 1'000; ++i) frames.push_back("x");
  f.publisher.send_frames(frames);
  REQUIRE(eventually([&] { return f.feed().errors.load() == errors + 1; }));
  CHECK(f.matched(tokens(1, 5)) == 0);
  CHECK(f.resets(reset_reason::gap) == 0);  // not read as a message: its number was not taken
}

TEST_CASE("subscriber: after a restart, the new engine's buffered history is caught up on", "[kv][subscriber]") {
  fixture f;
  const auto replay = f.publisher.serve_replays(f.context);
  f.subscribe(replay);
  f.join();
  const auto old_prompt = tokens(2, 100);
  f.store(old_prompt, 20);
  // The engine starts again at 0 (same socket here: no disconnection seen), stores a prompt dplb misses,
  // and then sends one it hears: the restart drops the old index and replays the new history.
  f.publisher.forget_history(0);
  f.publisher.send(removed_batch(999'997), std::nullopt, /*lost=*/true);  // 0
  const auto missed = tokens(2, 400);
  f.publisher.send(stored_batch(missed, 40), std::nullopt, /*lost=*/true);  // 1
  const auto heard = tokens(1, 800);
  f.publisher.send(stored_batch(heard, 80));  // 2: below the last number heard, a restart
  REQUIRE(eventually([&] { return f.matched(heard) == 1; }));
  CHECK(f.matched(missed) == 2);
  CHECK(f.matched(old_prompt) == 0);
  CHECK(f.resets(reset_reason::restart) == 1);
}

TEST_CASE("subscriber: a replay socket that never answers delays no other rank's events", "[kv][subscriber]") {
  zmq::context_t context{1};
  event_index index{1'000, 8};
  // Rank 0's replay socket takes requests and never answers (a wedged engine, or another service on the port).
  zmq::socket_t silent(context, zmq::socket_type::router);
  silent.set(zmq::sockopt::linger, 0);
  silent.bind("tcp://127.0.0.1:*");
  fake_publisher wedged(context);
  fake_publisher healthy(context);
  // A replay deadline far beyond the waits below: a replay that held up the other rank would fail the test.
  event_subscriber subscriber(index, subscriber_options{.poll_period = std::chrono::milliseconds(5),
                                                        .replay_timeout = std::chrono::seconds(60),
                                                        .replay_backoff = std::chrono::seconds(60),
                                                        .receive_queue = 4});
  subscriber.set_sources({{0, wedged.endpoint(), silent.get(zmq::sockopt::last_endpoint)}, {1, healthy.endpoint(), ""}});
  subscriber.start();
  // Rank 0's first message heard asks its replay socket for what came before it.
  REQUIRE(eventually([&] {
    wedged.send(removed_batch(999'999), /*seq=*/5);
    std::array<zmq::pollitem_t, 1> item{{{silent.handle(), 0, ZMQ_POLLIN, 0}}};
    return zmq::poll(item.data(), 1, std::chrono::milliseconds(20)) > 0;
  }));
  const auto prompt = tokens(2, 100);
  REQUIRE(eventually([&] {
    healthy.send(stored_batch(prompt, 20));
    return eventually(
        [&] {
          std::vector<std::uint32_t> m;
          index.match(chain_of(prompt), 2, m);
          return m[1] == 2;
        },
        std::chrono::milliseconds(20));
  }));
  CHECK(index.feed(0)->events.load() == 0);  // rank 0 waits for its replay, holding what it heard
  subscriber.stop();
}

TEST_CASE("subscriber: a message that would decode beyond max_decoded_bytes is counted, and the index is unchanged",
          "[kv][subscriber]") {
  fixture f;
  f.subscribe();
  f.join();
  const auto prompt = tokens(2, 100);
  f.store(prompt, 20);
  const auto errors = f.feed().errors.load();
  const auto events = f.feed().events.load();
  // 40 removals of 262,144 one-byte hashes (one of them the prompt's first block): 10 MiB sent, 80 MiB decoded.
  msgpack_writer w;
  w.array(2).float64(1.0e9).array(40);
  for (int e = 0; e < 40; ++e) {
    w.array(2).str("BlockRemoved").array(static_cast<std::uint32_t>(max_hashes_per_event));
    for (std::size_t i = 0; i < max_hashes_per_event; ++i) w.uint(i % 100 == 0 ? 20 : i % 100);
  }
  const auto bytes = w.bytes();
  f.publisher.send({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  REQUIRE(eventually([&] { return f.feed().errors.load() == errors + 1; }, std::chrono::seconds(30)));
  CHECK(f.feed().events.load() == events);
  CHECK(f.matched(prompt) == 2);
  CHECK(f.feed().blocks.load() == 2);
  const auto more = tokens(1, 900);
  f.store(more, 90);  // the next message is read as usual: no gap, no reset
  CHECK(f.resets(reset_reason::gap) == 0);
}
