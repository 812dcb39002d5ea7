// vLLM's KV-cache events from the running mock (--simulate --kv-events-port): a ZMQ subscriber and a
// replay client against the real program over loopback. Every wait is bounded and on an event (a zmq
// poll with a deadline), never a sleep: a subscriber first waits until a probe message reaches it (the
// PUB/SUB slow joiner), and the probe's seq=-1 leaves the numbering at 0 for the engine's own batches.

#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <variant>
#include <vector>
#include <zmq.hpp>

#include "dplb/kv/chain_hash.hpp"
#include "dplb/kv/kv_event.hpp"
#include "free_ports.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct message {
  std::string topic;
  std::int64_t seq = 0;
  std::string payload;
};

std::int64_t seq_of(const zmq::message_t& frame) {
  REQUIRE(frame.size() == 8);
  const auto s = dplb::kv::decode_sequence_frame(std::as_bytes(std::span(static_cast<const char*>(frame.data()), 8)));
  REQUIRE(s);
  return *s;
}

std::string frame_of(std::int64_t seq) {
  std::string f(8, '\0');
  for (int i = 0; i < 8; ++i) f[i] = static_cast<char>(static_cast<std::uint64_t>(seq) >> (56 - 8 * i));
  return f;
}

// The next message of a SUB socket within the deadline, if any.
std::optional<message> receive(zmq::socket_t& sub, std::chrono::milliseconds deadline = 5000ms) {
  zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, scaled(deadline)) == 0) return std::nullopt;
  std::vector<zmq::message_t> frames(3);
  for (auto& f : frames) {
    REQUIRE(sub.recv(f, zmq::recv_flags::none));
  }
  REQUIRE_FALSE(frames[2].more());
  return message{frames[0].to_string(), seq_of(frames[1]), frames[2].to_string()};
}

dplb::kv::event_batch decoded(const std::string& payload) {
  auto r = dplb::kv::decode_event_batch(std::as_bytes(std::span(payload.data(), payload.size())));
  INFO(r.error);
  REQUIRE(r.ok());
  REQUIRE(r.skipped_events() == 0);
  return std::move(r.batch);
}

http_response admin_post(const mock_engine& mock, const std::string& target, const std::string& body = {}) {
  http_connection c(mock.admin_port());
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, target, 11};
  req.body() = body;
  req.prepare_payload();
  return c.send(std::move(req));
}

// A subscriber of one engine that has seen a message, so that it misses nothing published from now
// on: probes (admin publish with seq=-1, so the engine's numbering stays at 0) until one arrives. Once probe
// k arrived, every later one was published to a connected subscriber and will arrive too: it reads them up
// to the last one sent, so that none is taken later for the test's own messages (a probe late by more than
// a fixed drain time, on a loaded machine, was).
zmq::socket_t subscribed(zmq::context_t& context, const mock_engine& mock, std::uint16_t port, unsigned rank,
                         unsigned engine, const std::string& topic = "") {
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::subscribe, topic);
  sub.connect("tcp://127.0.0.1:" + std::to_string(port));
  const auto target = "/kv-events/publish?rank=" + std::to_string(rank) + "&engine=" + std::to_string(engine) + "&seq=-1";
  for (int attempt = 0; attempt < 100; ++attempt) {
    const auto probe = "probe-" + std::to_string(attempt);
    REQUIRE(admin_post(mock, target, probe).status == 200);
    if (auto m = receive(sub, 100ms)) {
      for (;;) {
        CHECK(m->seq == -1);
        REQUIRE(m->payload.starts_with("probe-"));
        if (m->payload == probe) return sub;
        m = receive(sub);
        REQUIRE(m);
      }
    }
  }
  FAIL("the subscriber never received a probe");
  return sub;
}

http_response complete(std::uint16_t port, json body, unsigned engine) {
  http_connection c(port);
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
  req.set(bhttp::field::content_type, "application/json");
  req.set("X-data-parallel-rank", std::to_string(engine));
  body["model"] = "mock-model";
  req.body() = body.dump();
  req.prepare_payload();
  return c.send(std::move(req));
}

std::vector<std::uint32_t> tokenized(std::uint16_t port, const json& body) {
  const auto r = http_post_json(port, "/tokenize", body.dump());
  REQUIRE(r.status == 200);
  return json::parse(r.body)["tokens"].get<std::vector<std::uint32_t>>();
}

std::string words(const std::string& stem, unsigned n) {
  std::string s;
  for (unsigned i = 0; i < n; ++i) s += (i == 0 ? "" : " ") + stem + std::to_string(i);
  return s;
}

// A replay request from a DEALER (optionally with REQ's empty delimiter): the messages up to the end
// marker, in order.
std::vector<message> replay(zmq::context_t& context, std::uint16_t port, std::int64_t start, bool delimited) {
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect("tcp://127.0.0.1:" + std::to_string(port));
  if (delimited) dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(frame_of(start)), zmq::send_flags::none);
  std::vector<message> out;
  for (;;) {
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&item, 1, scaled(5000ms)) == 1);
    std::vector<zmq::message_t> frames;
    do {
      frames.emplace_back();
      REQUIRE(dealer.recv(frames.back(), zmq::recv_flags::none));
    } while (frames.back().more());
    REQUIRE(frames.size() == (delimited ? 3U : 2U));
    if (delimited) CHECK(frames[0].size() == 0);
    const auto& seq = frames[frames.size() - 2];
    message m{"", seq_of(seq), frames.back().to_string()};
    if (m.seq == -1) {
      CHECK(m.payload.empty());
      return out;
    }
    out.push_back(std::move(m));
  }
}

}  // namespace

TEST_CASE("mock kv events: a request's prompt blocks arrive as BlockStored with /tokenize's ids, numbered "
          "from 0, and replay, raw publish and reset",
          "[mock][kv-events]") {
  const unsigned engines = 2;
  const auto events = free_port_range(engines);
  const auto replays = free_port_range(engines);
  REQUIRE((replays >= events + engines || events >= replays + engines));
  mock_engine mock(1, {"--dp", "2", "--simulate", "--time-scale", "10", "--kv-events-port", std::to_string(events),
                       "--kv-replay-port", std::to_string(replays)});
  const auto out = mock.process().output();
  CHECK(out.find("mock-engine rank 0 engine 1 kv-events tcp://127.0.0.1:" + std::to_string(events + 1) +
                 " kv-replay tcp://127.0.0.1:" + std::to_string(replays + 1) + "\n") != std::string::npos);

  zmq::context_t context;
  auto sub = subscribed(context, mock, events, 0, 0);

  // 40 words: two full blocks of 16 are cached after the prefill; the rest is a partial block.
  const auto prompt = words("p", 40);
  REQUIRE(complete(mock.ports()[0], {{"prompt", prompt}, {"max_tokens", 1}}, 0).status == 200);
  const auto ids = tokenized(mock.ports()[0], {{"model", "mock-model"}, {"prompt", prompt}});
  REQUIRE(ids.size() == 40);
  const auto first = receive(sub);
  REQUIRE(first);
  CHECK(first->topic.empty());
  CHECK(first->seq == 0);
  const auto batch = decoded(first->payload);
  CHECK(batch.dp_rank == 0);
  CHECK(batch.ts > 1.6e9);
  REQUIRE(batch.events.size() == 1);
  const auto& stored = std::get<dplb::kv::block_stored>(batch.events[0]);
  CHECK(stored.block_hashes.size() == 2);
  CHECK_FALSE(stored.parent_block_hash);
  CHECK(stored.block_size == 16);
  CHECK(stored.token_ids == std::vector<std::uint32_t>(ids.begin(), ids.begin() + 32));
  CHECK(stored.medium == "GPU");

  // A longer prompt with the same head: only its new blocks, chained to the cached ones.
  const auto longer = prompt + " " + words("q", 24);  // 64 words: blocks 2 and 3 are new
  REQUIRE(complete(mock.ports()[0], {{"prompt", longer}, {"max_tokens", 1}}, 0).status == 200);
  const auto second = receive(sub);
  REQUIRE(second);
  CHECK(second->seq == 1);
  const auto more = decoded(second->payload);
  REQUIRE(more.events.size() == 1);
  const auto& extended = std::get<dplb::kv::block_stored>(more.events[0]);
  CHECK(extended.block_hashes.size() == 2);
  CHECK(extended.parent_block_hash == stored.block_hashes[1]);
  const auto longer_ids = tokenized(mock.ports()[0], {{"prompt", longer}});
  CHECK(extended.token_ids == std::vector<std::uint32_t>(longer_ids.begin() + 32, longer_ids.end()));

  // Replay from 0 (the probes were seq -1): both batches, then the end marker; REQ's envelope too.
  for (const bool delimited : {false, true}) {
    const auto replayed = replay(context, replays, 0, delimited);
    REQUIRE(replayed.size() == 2);
    CHECK(replayed[0].seq == 0);
    CHECK(replayed[0].payload == first->payload);
    CHECK(replayed[1].seq == 1);
    CHECK(replayed[1].payload == second->payload);
  }
  CHECK(replay(context, replays, 1, false).size() == 1);
  CHECK(replay(context, replays + 1, 0, false).empty());  // engine 1 sent nothing

  // Raw bytes as the next message, then a chosen seq and numbering on from it.
  const std::string garbage("\xc1\x00garbage", 9);
  auto r = admin_post(mock, "/kv-events/publish?rank=0&engine=0", garbage);
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["seq"] == 2);
  auto raw = receive(sub);
  REQUIRE(raw);
  CHECK(raw->seq == 2);
  CHECK(raw->payload == garbage);
  REQUIRE(admin_post(mock, "/kv-events/publish?rank=0&engine=0&seq=100", "x").status == 200);
  REQUIRE(admin_post(mock, "/kv-events/publish?rank=0&engine=0", "y").status == 200);
  raw = receive(sub);
  REQUIRE(raw);
  CHECK(raw->seq == 100);
  raw = receive(sub);
  REQUIRE(raw);
  CHECK(raw->seq == 101);
  CHECK(raw->payload == "y");

  // Reset: AllBlocksCleared, and the prompt's blocks are stored again when it comes back.
  REQUIRE(admin_post(mock, "/kv-events/reset?rank=0&engine=0").status == 200);
  const auto cleared = receive(sub);
  REQUIRE(cleared);
  CHECK(cleared->seq == 102);
  const auto reset = decoded(cleared->payload);
  REQUIRE(reset.events.size() == 1);
  CHECK(std::holds_alternative<dplb::kv::all_blocks_cleared>(reset.events[0]));
  REQUIRE(complete(mock.ports()[0], {{"prompt", prompt}, {"max_tokens", 1}}, 0).status == 200);
  const auto again = receive(sub);
  REQUIRE(again);
  const auto restored = decoded(again->payload);
  REQUIRE(restored.events.size() == 1);
  CHECK(std::get<dplb::kv::block_stored>(restored.events[0]).block_hashes == stored.block_hashes);

  const auto metrics = mock.metrics(0);
  CHECK(metrics.at("mock_kv_events_published_total{engine=\"0\"}") == 4);  // 3 stored, 1 cleared
  CHECK(metrics.at("mock_kv_event_batches_dropped_total{engine=\"0\"}") == 0);
}

TEST_CASE("mock kv events: engine j of a port is data_parallel_rank j on base + i * dp + j, with the array "
          "encoding, integer hashes, a topic and cache_salt",
          "[mock][kv-events]") {
  const unsigned engines = 4;  // --ranks 2 --dp 2
  const auto events = free_port_range(engines);
  mock_engine mock(2, {"--dp", "2", "--simulate", "--time-scale", "10", "--kv-events-port", std::to_string(events),
                       "--kv-events-encoding", "array", "--kv-events-int-hashes", "--kv-events-topic", "kv"});
  zmq::context_t context;
  auto sub = subscribed(context, mock, static_cast<std::uint16_t>(events + 3), 1, 1, "kv");  // rank 1, engine 1

  const auto prompt = words("s", 16);
  REQUIRE(complete(mock.ports()[1], {{"prompt", prompt}, {"max_tokens", 1}, {"cache_salt", "tenant-a"}}, 1).status ==
          200);
  const auto m = receive(sub);
  REQUIRE(m);
  CHECK(m->topic == "kv");
  CHECK(m->seq == 0);
  CHECK(static_cast<unsigned char>(m->payload[0]) == 0x93);  // the array encoding: [ts, events, dp rank]
  const auto batch = decoded(m->payload);
  CHECK(batch.dp_rank == 1);
  REQUIRE(batch.events.size() == 1);
  const auto& stored = std::get<dplb::kv::block_stored>(batch.events[0]);
  CHECK(stored.token_ids == tokenized(mock.ports()[1], {{"prompt", prompt}}));
  const std::string_view salt[] = {"tenant-a"};
  REQUIRE(stored.extra_keys);
  CHECK(*stored.extra_keys == std::vector<std::uint64_t>{dplb::kv::extra_keys_digest(salt)});

  // The same prompt unsalted shares nothing: its block is stored under another hash.
  REQUIRE(complete(mock.ports()[1], {{"prompt", prompt}, {"max_tokens", 1}}, 1).status == 200);
  const auto plain = receive(sub);
  REQUIRE(plain);
  const auto unsalted = std::get<dplb::kv::block_stored>(decoded(plain->payload).events.at(0));
  CHECK(unsalted.block_hashes != stored.block_hashes);
  CHECK_FALSE(unsalted.extra_keys);
}

TEST_CASE("mock kv events: flags refused at start-up, and /tokenize on a mock without events",
          "[mock][kv-events]") {
  mock_engine mock(1);
  const auto r = http_post_json(mock.ports()[0], "/tokenize", R"({"model":"mock-model","prompt":"a b"})");
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["count"] == 2);
  CHECK(http_post_json(mock.ports()[0], "/tokenize", R"({"model":"other","prompt":"a"})").status == 404);
  CHECK(admin_post(mock, "/kv-events/publish?rank=0&engine=0", "x").status == 400);
  CHECK(admin_post(mock, "/kv-events/reset?rank=0").status == 400);

  child_process refused(mock_engine_binary(), {"--port", "0", "--kv-events-port", "5557"});
  CHECK_FALSE(refused.wait_for_line(std::regex("mock-engine ready"), 5s));
  CHECK(refused.output().find("needs --simulate") != std::string::npos);
}
