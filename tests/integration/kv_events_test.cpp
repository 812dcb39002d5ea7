// Precise prefix routing through the real dplb and the mock engine's real-format KV-cache events
// (--simulate --kv-events-port: vLLM's ZMQ messages from its simulated prefix cache). A prefix that only the
// events tell of (a client that bypassed dplb filled the cache) attracts its requests; an eviction or a
// cache reset takes it away; DP ranks behind one URL publish on base + j; garbage is counted and skipped;
// a lost batch drops the rank's index; bursts of unrelated prompts stay exact; the load bound holds; text
// is matched through the engine's /tokenize.

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../unit/kv/msgpack_writer.hpp"
#include "await.hpp"
#include "free_ports.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr int block_size = 16;  // the mock's and dplb's default

// `blocks` full blocks of token ids first, first + 1, ...
std::vector<std::uint32_t> ids(int blocks, std::uint32_t first) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(blocks * block_size));
  std::iota(out.begin(), out.end(), first);
  return out;
}

std::vector<std::uint32_t> concat(std::vector<std::uint32_t> a, const std::vector<std::uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bhttp::request<bhttp::string_body> completion(const json& prompt, const std::string& dp_rank = "") {
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::host, "x");
  r.set(bhttp::field::content_type, "application/json");
  if (!dp_rank.empty()) r.set("X-data-parallel-rank", dp_rank);
  r.body() = json{{"model", "mock-model"}, {"prompt", prompt}, {"max_tokens", 1}}.dump();
  r.prepare_payload();
  return r;
}

std::string rank_of(std::uint16_t port, const json& prompt) {
  http_connection client(port);
  const auto r = client.send(completion(prompt));
  REQUIRE(r.status == 200);
  return std::string(r.headers["x-dplb-rank"]);
}

std::string label(std::size_t rank) { return "rank=\"" + std::to_string(rank) + "\""; }

// An engine with its events: `ranks` ports of `dp` simulated engines each, publishing on fixed ports
// (dplb must be told them), replay sockets too.
struct evented_engine {
  std::uint16_t events_port = 0;
  std::uint16_t replay_port = 0;
  std::unique_ptr<mock_engine> started;
  mock_engine& engine;

  evented_engine(std::size_t ranks, unsigned dp, std::vector<std::string> extra = {})
      : started(start(ranks, dp, extra, events_port, replay_port)), engine(*started) {}

  // The fixed ports are free when drawn, but another process (a parallel test's Redis or mock) may bind
  // one before the mock does: then another range is drawn.
  static std::unique_ptr<mock_engine> start(std::size_t ranks, unsigned dp, const std::vector<std::string>& extra,
                                            std::uint16_t& events, std::uint16_t& replay) {
    for (int attempt = 1;; ++attempt) {
      events = free_port_range(static_cast<unsigned>(2 * ranks * dp));
      replay = static_cast<std::uint16_t>(events + ranks * dp);
      try {
        return std::make_unique<mock_engine>(ranks, with_events(ranks, dp, extra, events, replay));
      } catch (const std::runtime_error& e) {
        if (attempt == 3 || std::string_view(e.what()).find("Address already in use") == std::string_view::npos) throw;
      }
    }
  }

  static std::vector<std::string> with_events(std::size_t ranks, unsigned dp, std::vector<std::string> extra,
                                              std::uint16_t events, std::uint16_t replay) {
    std::vector<std::string> args{"--simulate", "--time-scale", "100", "--dp", std::to_string(dp),
                                  "--kv-events-port", std::to_string(events), "--kv-replay-port", std::to_string(replay)};
    (void)ranks;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // One backend per port, each naming its own publisher (vLLM's external load balancing).
  std::vector<std::string> backends(bool replay = true) const {
    std::vector<std::string> out;
    const auto urls = engine.urls();
    for (std::size_t i = 0; i < urls.size(); ++i) {
      auto url = urls[i] + "#kv-events=tcp://127.0.0.1:" + std::to_string(events_port + i);
      if (replay) url += "&kv-replay=tcp://127.0.0.1:" + std::to_string(replay_port + i);
      out.push_back(url);
    }
    return out;
  }

  // Publishes `payload` as engine j of port i's next batch (or under sequence `seq`).
  void publish(std::size_t rank, std::size_t dp_engine, const std::string& payload, std::optional<std::int64_t> seq = {}) {
    std::string target = "/kv-events/publish?rank=" + std::to_string(rank) + "&engine=" + std::to_string(dp_engine);
    if (seq) target += "&seq=" + std::to_string(*seq);
    const auto r = http_post_json(engine.admin_port(), target, payload);
    REQUIRE(r.status == 200);
  }
};

// A removal of a block no rank holds: an event that changes nothing, counted as applied.
std::string harmless_batch() {
  dplb::kv::test::msgpack_writer w;
  w.array(2).float64(1.0e9).array(1).array(3).str("BlockRemoved").array(1).uint(7).str("GPU");
  const auto bytes = w.bytes();
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Waits until dplb receives the events of global rank `rank` (engine j of mock port i): ZMQ's slow joiner
// loses what is published before the subscription reaches the publisher.
void await_subscribed(evented_engine& e, const dplb_proxy& proxy, std::size_t rank, std::size_t port, std::size_t dp_engine) {
  // (the series appears once dplb's subscriber has taken the rank's source up: read as 0 until then)
  const auto events = [&](const auto& metrics) { return metric_sum(metrics, "dplb_kv_events_total{", {label(rank)}); };
  for (int attempt = 0; attempt < 100; ++attempt) {
    const double before = events(scrape_metrics(proxy.port()));
    e.publish(port, dp_engine, harmless_batch());
    const auto m = await_metrics(proxy.port(), [&](const auto& metrics) { return events(metrics) > before; }, 100ms);
    if (events(m) > before) return;
  }
  FAIL("dplb never received rank " << rank << "'s events");
}

double blocks_of(const dplb_proxy& proxy, std::size_t rank) {
  return metric_sum(scrape_metrics(proxy.port()), "dplb_kv_blocks{", {label(rank)});
}

}  // namespace

TEST_CASE("kv events: a prefix cached behind dplb's back attracts its requests, and eviction and reset take it away",
          "[kv-events]") {
  // 48 blocks per engine: a 32-block prefix fits once, and a second long prompt evicts it.
  evented_engine e(4, 1, {"--kv-blocks", "48"});
  dplb_proxy proxy(e.backends(), {"--policy", "prefix-aware"});
  for (std::size_t r = 0; r < 4; ++r) await_subscribed(e, proxy, r, r, 0);

  const auto prefix = ids(32, 1000);
  // A client that bypasses dplb fills rank 2's cache: dplb never routed this prefix anywhere.
  {
    http_connection direct(e.engine.ports()[2]);
    REQUIRE(direct.send(completion(prefix)).status == 200);
  }
  const auto m = await_metrics(proxy.port(), [](const auto& metrics) {
    return metric_sum(metrics, "dplb_kv_blocks{", {label(2)}) >= 32;
  });
  REQUIRE(metric_sum(m, "dplb_kv_blocks{", {label(2)}) >= 32);
  for (int i = 0; i < 6; ++i) {
    INFO("request " << i);
    CHECK(rank_of(proxy.port(), concat(prefix, ids(1, 50'000 + 100 * i))) == "2");
  }

  // A prompt of 47 blocks on rank 2 (48 with its output) takes every block of its cache: the engine says
  // BlockRemoved for each cached one, BlockStored for the new ones (in that order, in one batch), and the
  // prefix no longer attracts anything: the next request of it is a miss, placed by load.
  {
    http_connection direct(e.engine.ports()[2]);
    REQUIRE(direct.send(completion(ids(47, 90'000))).status == 200);
  }
  REQUIRE(await_until([&] { return blocks_of(proxy, 2); }, [](double b) { return b >= 47; }) >= 47);
  const auto missed = metric_sum(scrape_metrics(proxy.port()), "dplb_prefix_decisions_total{", {"outcome=\"missed\""});
  rank_of(proxy.port(), concat(prefix, ids(1, 70'000)));
  CHECK(metric_sum(scrape_metrics(proxy.port()), "dplb_prefix_decisions_total{", {"outcome=\"missed\""}) == missed + 1);

  // A cache reset (vLLM's reset_prefix_cache: AllBlocksCleared) empties the rank's index at once.
  const auto holder = rank_of(proxy.port(), concat(prefix, ids(1, 80'000)));
  const auto holder_rank = static_cast<std::size_t>(std::stoul(holder));
  REQUIRE(await_until([&] { return blocks_of(proxy, holder_rank); }, [](double b) { return b > 0; }) > 0);
  REQUIRE(http_post_json(e.engine.admin_port(), "/kv-events/reset?rank=" + holder, "").status == 200);
  CHECK(await_until([&] { return blocks_of(proxy, holder_rank); }, [](double b) { return b == 0; }) == 0);
}

TEST_CASE("kv events: DP ranks behind one URL publish on base + j, and each is its own rank", "[kv-events]") {
  evented_engine e(1, 4);
  const auto url = e.engine.urls()[0] + "#dp=4&kv-events=tcp://127.0.0.1:" + std::to_string(e.events_port) +
                   "&kv-replay=tcp://127.0.0.1:" + std::to_string(e.replay_port);
  dplb_proxy proxy({url}, {"--policy", "prefix-aware"});
  // Every rank's event series is there from the first scrape, at 0.
  const auto first = scrape_metrics(proxy.port());
  for (std::size_t j = 0; j < 4; ++j) {
    INFO("rank " << j);
    CHECK(first.count("dplb_kv_blocks{" + label(j) + "}") == 1);
    CHECK(first.count("dplb_kv_events_total{" + label(j) + "}") == 1);
    CHECK(first.count("dplb_kv_event_errors_total{" + label(j) + "}") == 1);
  }
  for (std::size_t j = 0; j < 4; ++j) await_subscribed(e, proxy, j, 0, j);
  const auto prefix = ids(8, 5000);
  {
    http_connection direct(e.engine.ports()[0]);
    REQUIRE(direct.send(completion(prefix, "3")).status == 200);  // engine 3's cache, behind dplb's back
  }
  REQUIRE(await_until([&] { return blocks_of(proxy, 3); }, [](double b) { return b >= 8; }) >= 8);
  CHECK(blocks_of(proxy, 0) == 0);
  for (int i = 0; i < 4; ++i) CHECK(rank_of(proxy.port(), concat(prefix, ids(1, 60'000 + 100 * i))) == "3");
}

TEST_CASE("kv events: garbage is counted and skipped, and a lost batch or a restart drops the rank's index",
          "[kv-events]") {
  evented_engine e(2, 1);
  dplb_proxy proxy(e.backends(/*replay=*/false), {"--policy", "prefix-aware"});
  for (std::size_t r = 0; r < 2; ++r) await_subscribed(e, proxy, r, r, 0);
  const auto prefix = ids(8, 7000);
  {
    http_connection direct(e.engine.ports()[1]);
    REQUIRE(direct.send(completion(prefix)).status == 200);
  }
  REQUIRE(await_until([&] { return blocks_of(proxy, 1); }, [](double b) { return b >= 8; }) >= 8);

  e.publish(1, 0, "this is not msgpack");
  dplb::kv::test::msgpack_writer unknown;
  unknown.array(2).float64(1.0e9).array(1).array(2).str("Nope").uint(1);  // a batch of one event of no known type
  const auto unknown_bytes = unknown.bytes();
  e.publish(1, 0, {reinterpret_cast<const char*>(unknown_bytes.data()), unknown_bytes.size()});
  const auto errors = await_metrics(proxy.port(), [](const auto& metrics) {
    return metric_sum(metrics, "dplb_kv_event_errors_total{", {label(1)}) >= 2;
  });
  CHECK(metric_sum(errors, "dplb_kv_event_errors_total{", {label(1)}) == 2);
  CHECK(blocks_of(proxy, 1) >= 8);  // kept
  CHECK(rank_of(proxy.port(), concat(prefix, ids(1, 61'000))) == "1");

  // A sequence gap with no replay socket: what was lost cannot be known, so the index is dropped.
  e.publish(1, 0, harmless_batch(), 1'000);
  const auto gap = await_metrics(proxy.port(), [](const auto& metrics) {
    return metric_sum(metrics, "dplb_kv_index_resets_total{", {label(1), "reason=\"gap\""}) >= 1;
  });
  CHECK(metric_sum(gap, "dplb_kv_index_resets_total{", {label(1), "reason=\"gap\""}) == 1);
  CHECK(metric_sum(gap, "dplb_kv_blocks{", {label(1)}) == 0);
  // The sequence going back: the publisher restarted.
  e.publish(1, 0, harmless_batch(), 0);
  const auto restart = await_metrics(proxy.port(), [](const auto& metrics) {
    return metric_sum(metrics, "dplb_kv_index_resets_total{", {label(1), "reason=\"restart\""}) >= 1;
  });
  CHECK(metric_sum(restart, "dplb_kv_index_resets_total{", {label(1), "reason=\"restart\""}) == 1);
  CHECK(metric_sum(restart, "dplb_kv_index_resets_total{", {label(0)}) == 0);  // the other rank kept its own
}

TEST_CASE("kv events: a burst of unrelated prompts lands exactly even, and a prefix nothing caches yet follows its first request within the bound",
          "[kv-events]") {
  evented_engine e(4, 1, {"--start-after", "64"});
  dplb_proxy proxy(e.backends(), {"--policy", "prefix-aware", "--load-bound", "1.25"});
  for (std::size_t r = 0; r < 4; ++r) await_subscribed(e, proxy, r, r, 0);
  // 64 requests in flight at once (no engine step runs before the 64th arrives): 24 unrelated prompts, placed
  // exactly as least-inflight places them, then 40 sharing a prefix.
  std::vector<std::unique_ptr<http_connection>> held;
  const auto send = [&](const json& prompt) {
    held.push_back(std::make_unique<http_connection>(proxy.port(), 30s));
    std::ostringstream wire;
    wire << completion(prompt);
    held.back()->write_raw(wire.str());
  };
  for (int i = 0; i < 24; ++i) send(ids(8, 100'000 + 1000 * static_cast<std::uint32_t>(i)));
  const auto m = await_metrics(proxy.port(), [](const auto& metrics) { return metric_sum(metrics, "dplb_rank_inflight{") == 24; });
  for (std::size_t r = 0; r < 4; ++r) CHECK(metric_sum(m, "dplb_rank_inflight{", {label(r)}) == 6);
  const auto hot = ids(8, 900'000);
  for (int i = 0; i < 40; ++i) send(concat(hot, ids(1, 950'000 + 100 * static_cast<std::uint32_t>(i))));
  // Nothing of `hot` is cached yet (no step runs before the 64th request arrives): the events show nothing, so
  // its first request is placed by load and the others follow it while its prefill is pending, up to the load
  // bound: ceil(1.25 x 64 / 4) = 20 on that rank at most, the rest by load.
  for (auto& c : held) {
    const auto reply = c->read_responses(1, 30s);
    CHECK(reply.final_responses().size() == 1);
  }
  const auto all = scrape_metrics(proxy.port());
  double most = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    const double picks = metric_sum(all, "dplb_requests_total{", {label(r)});
    CHECK(picks <= 20);
    CHECK(picks >= 6);
    most = std::max(most, picks);
  }
  CHECK(most >= 16);  // the hot prefix gathered where it went first
  CHECK(metric_sum(all, "dplb_requests_total{") == 64);
}

TEST_CASE("kv events: a hot prefix the events place on one rank keeps within --load-bound", "[kv-events]") {
  evented_engine e(4, 1, {"--start-after", "41"});
  dplb_proxy proxy(e.backends(), {"--policy", "prefix-aware", "--load-bound", "1.25"});
  for (std::size_t r = 0; r < 4; ++r) await_subscribed(e, proxy, r, r, 0);
  // The prefix is published as stored on rank 0 (hand-made, in vLLM's map encoding): no step has run.
  const auto hot = ids(8, 400'000);
  dplb::kv::test::msgpack_writer w;
  w.map(2).str("ts").float64(1.0e9).str("events").array(1).map(8);
  w.str("type").str("BlockStored").str("block_hashes").array(8);
  for (int b = 0; b < 8; ++b) w.uint(static_cast<std::uint64_t>(4000 + b));
  w.str("parent_block_hash").nil().str("token_ids").uints(hot).str("block_size").uint(block_size);
  w.str("lora_id").nil().str("medium").str("GPU").str("lora_name").nil();
  const auto bytes = w.bytes();
  e.publish(0, 0, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  REQUIRE(await_until([&] { return blocks_of(proxy, 0); }, [](double b) { return b >= 8; }) >= 8);
  std::vector<std::unique_ptr<http_connection>> held;
  for (int i = 0; i < 40; ++i) {
    held.push_back(std::make_unique<http_connection>(proxy.port(), 30s));
    std::ostringstream wire;
    wire << completion(concat(hot, ids(1, 450'000 + 100 * static_cast<std::uint32_t>(i))));
    held.back()->write_raw(wire.str());
  }
  const auto m = await_metrics(proxy.port(), [](const auto& metrics) { return metric_sum(metrics, "dplb_rank_inflight{") == 40; });
  REQUIRE(metric_sum(m, "dplb_rank_inflight{") == 40);
  CHECK(metric_sum(m, "dplb_rank_inflight{", {label(0)}) >= 10);  // where the prefix is, up to its bound
  for (std::size_t r = 0; r < 4; ++r) CHECK(metric_sum(m, "dplb_rank_inflight{", {label(r)}) <= std::ceil(1.25 * 40 / 4));
  CHECK(metric_sum(m, "dplb_prefix_decisions_total{", {"outcome=\"taken\""}) >= 10);
  CHECK(metric_sum(m, "dplb_prefix_decisions_total{", {"outcome=\"overridden\""}) > 0);
  held.push_back(std::make_unique<http_connection>(proxy.port(), 30s));  // the 41st starts the engines
  std::ostringstream wire;
  wire << completion(ids(2, 3));
  held.back()->write_raw(wire.str());
  for (auto& c : held) CHECK(c->read_responses(1, 30s).final_responses().size() == 1);
}

TEST_CASE("kv events: --tokenize engine matches text prompts and chat messages through /tokenize", "[kv-events]") {
  evented_engine e(4, 1);
  dplb_proxy proxy(e.backends(), {"--policy", "prefix-aware", "--tokenize", "engine"});
  for (std::size_t r = 0; r < 4; ++r) await_subscribed(e, proxy, r, r, 0);
  std::string document;
  for (int w = 0; w < 200; ++w) document += "word" + std::to_string(w) + " ";
  {
    http_connection direct(e.engine.ports()[3]);
    REQUIRE(direct.send(completion(document)).status == 200);
  }
  REQUIRE(await_until([&] { return blocks_of(proxy, 3); }, [](double b) { return b >= 12; }) >= 12);
  for (int i = 0; i < 4; ++i) CHECK(rank_of(proxy.port(), document + "question " + std::to_string(i)) == "3");
  const auto m = scrape_metrics(proxy.port());
  CHECK(metric_sum(m, "dplb_tokenize_requests_total{", {"outcome=\"ok\""}) == 4);
  CHECK(metric_sum(m, "dplb_tokenize_requests_total{", {"outcome=\"failed\""}) == 0);

  // Chat: the same conversation's blocks, cached on rank 1 by a direct request.
  const json messages = json::array({{{"role", "system"}, {"content", document}}, {{"role", "user"}, {"content", "hi"}}});
  const auto chat = [&](const json& msgs) {
    bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/chat/completions", 11};
    r.set(bhttp::field::host, "x");
    r.set(bhttp::field::content_type, "application/json");
    r.body() = json{{"model", "mock-model"}, {"messages", msgs}, {"max_tokens", 1}}.dump();
    r.prepare_payload();
    return r;
  };
  {
    http_connection direct(e.engine.ports()[1]);
    REQUIRE(direct.send(chat(messages)).status == 200);
  }
  REQUIRE(await_until([&] { return blocks_of(proxy, 1); }, [](double b) { return b >= 12; }) >= 12);
  json follow_up = messages;
  follow_up.push_back({{"role", "assistant"}, {"content", "tok"}});
  follow_up.push_back({{"role", "user"}, {"content", "and then?"}});
  http_connection client(proxy.port());
  const auto r = client.send(chat(follow_up));
  REQUIRE(r.status == 200);
  CHECK(std::string(r.headers["x-dplb-rank"]) == "1");
}
