// The shared ledger against a real redis-server (started by each test on a free loopback port): several
// replicas, each a shared_ledger with its own connections, driven by one io_context on the test's thread.
#include "dplb/ledger/redis_client.hpp"
#include "dplb/ledger/shared_ledger.hpp"

#include "../../support/redis_server.hpp"

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <signal.h>

#include <array>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

using namespace dplb::ledger;
using dplb::test::redis_server;
using dplb::test::scaled;
using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

namespace {

// Runs the io_context until the condition holds; false at the deadline (scaled by the timing slack).
template <class Pred>
bool run_until(boost::asio::io_context& io, Pred pred, milliseconds deadline = milliseconds(5000)) {
  const auto until = steady::now() + scaled(deadline);
  while (!pred()) {
    if (steady::now() >= until) return false;
    if (io.stopped()) io.restart();
    io.run_one_for(milliseconds(10));
  }
  return true;
}

// One dplb replica as the ledger sees it: its own counts (what it would register) and its ledger client.
struct replica {
  replica(boost::asio::io_context& io, std::uint16_t port, std::string name, std::string ns,
          std::function<void(ledger_options&)> adjust = {}) {
    ledger_options o;
    o.endpoint.host = "127.0.0.1";
    o.endpoint.port = port;
    o.ns = std::move(ns);
    o.replica = std::move(name);
    // Generous: these tests are about what the ledger decides, not how fast (the SIGSTOP test sets its own).
    o.timeout = scaled(milliseconds(1000));
    if (adjust) adjust(o);
    ledger = std::make_unique<shared_ledger>(
        io, o, [this] { return load(); }, [this](std::size_t rank) { freed.push_back(rank); });
    ledger->start();
  }

  // Picks and, like the balancer will, counts the pick as its own once the answer is handed over.
  void pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
            std::function<void(const ledger_pick&)> then = {}) {
    ledger->pick(candidates, policy, limit, [this, then](const ledger_pick& p) {
      if (p.ok && p.rank) ++in_flight[*p.rank];
      if (then) then(p);
    });
  }
  void release(std::size_t rank) {
    if (in_flight[rank] > 0) --in_flight[rank];
    ledger->release(rank);
  }

  // The same with tokens, kept as the balancer keeps them.
  void pick(std::span<const ledger_candidate> candidates, std::uint32_t limit, request_tokens cost,
            std::function<void(const ledger_pick&)> then) {
    ledger->pick(candidates, ledger_policy::least_tokens, limit, cost, [this, cost, then](const ledger_pick& p) {
      if (p.ok && p.rank) {
        ++in_flight[*p.rank];
        tokens[*p.rank].prompt_tokens += cost.prompt;
        tokens[*p.rank].cost_tokens += cost.prompt + cost.decode;
      }
      then(p);
    });
  }
  void prompt_done(std::size_t rank, std::uint64_t prompt) {
    tokens[rank].prompt_tokens -= prompt;
    ledger->prompt_done(rank, prompt);
  }
  void release(std::size_t rank, std::uint64_t prompt_left, std::uint64_t cost) {
    --in_flight[rank];
    tokens[rank].prompt_tokens -= prompt_left;
    tokens[rank].cost_tokens -= cost;
    ledger->release(rank, prompt_left, cost);
  }

  std::map<std::size_t, rank_load> load() const {
    auto out = tokens;
    for (const auto& [rank, n] : in_flight) out[rank].requests = n;
    return out;
  }

  std::map<std::size_t, std::uint32_t> in_flight;
  std::map<std::size_t, rank_load> tokens;  // prompt and cost tokens by rank (their requests: in_flight)
  std::vector<std::size_t> freed;
  std::unique_ptr<shared_ledger> ledger;
};

std::vector<ledger_candidate> equal_ranks(std::size_t n) {
  std::vector<ledger_candidate> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back({i, 1.0});
  return out;
}

// The ledger's view through one replica, awaited.
ledger_view view_of(boost::asio::io_context& io, replica& r) {
  std::optional<ledger_view> v;
  r.ledger->view([&](const ledger_view& got) { v = got; });
  REQUIRE(run_until(io, [&] { return v.has_value(); }));
  return *v;
}

// One command on a connection of its own (what an operator's redis-cli would send), awaited.
redis_result raw_command(boost::asio::io_context& io, std::uint16_t port, const std::vector<std::string>& argv) {
  redis_client_options o;
  o.endpoint.host = "127.0.0.1";
  o.endpoint.port = port;
  redis_client raw(io, o);
  raw.start();
  REQUIRE(run_until(io, [&] { return raw.up(); }));
  std::optional<redis_result> result;
  raw.command("raw", argv, [&](const redis_result& r) { result = r; });
  REQUIRE(run_until(io, [&] { return result.has_value(); }));
  return *result;
}

// One pick, awaited.
ledger_pick pick_now(boost::asio::io_context& io, replica& r, std::span<const ledger_candidate> candidates,
                     ledger_policy policy, std::uint32_t limit = 0) {
  std::optional<ledger_pick> p;
  r.pick(candidates, policy, limit, [&](const ledger_pick& got) { p = got; });
  REQUIRE(run_until(io, [&] { return p.has_value(); }));
  return *p;
}

}  // namespace

TEST_CASE("a burst through three replicas in any split lands exactly even, and round-robin is one rotation",
          "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  std::vector<std::unique_ptr<replica>> replicas;
  for (const char* name : {"a", "b", "c"}) replicas.push_back(std::make_unique<replica>(io, redis.port(), name, "burst"));
  REQUIRE(run_until(io, [&] {
    for (auto& r : replicas) if (!r->ledger->up()) return false;
    return true;
  }));
  const auto ranks = equal_ranks(4);

  SECTION("least-inflight: 250 picks sent at once through random replicas fill the ranks to 64/64/64/64") {
    // Replica a already holds 4 requests on rank 0 and 2 on rank 1; the burst comes through b and c, which
    // must see them (each replica's own counts, even with a shared tie rotation, would miss them).
    replicas[0]->in_flight = {{0, 4}, {1, 2}};
    replicas[0]->ledger->register_in_flight();
    REQUIRE(run_until(io, [&] { return view_of(io, *replicas[1]).total.size() == 2; }));
    const auto seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 random(seed);
    std::array<int, 3> split{};
    std::array<int, 4> landed{};
    int answers = 0, failed = 0;
    for (int i = 0; i < 250; ++i) {
      const auto who = std::uniform_int_distribution<std::size_t>(1, 2)(random);
      ++split[who];
      replicas[who]->pick(ranks, ledger_policy::least_inflight, 0, [&](const ledger_pick& p) {
        ++answers;
        if (!p.ok || !p.rank) ++failed;
        else ++landed[*p.rank];
      });
    }
    REQUIRE(run_until(io, [&] { return answers == 250; }));
    INFO("split b:c " << split[1] << ":" << split[2]);
    CHECK(failed == 0);
    CHECK(landed == std::array<int, 4>{60, 62, 64, 64});
    const auto v = view_of(io, *replicas[0]);
    CHECK(v.replicas == 3);
    CHECK(replicas[0]->in_flight == std::map<std::size_t, std::uint32_t>{{0, 4}, {1, 2}});
    CHECK(v.total == std::map<std::size_t, std::uint32_t>{{0, 64}, {1, 64}, {2, 64}, {3, 64}});
  }

  SECTION("least-inflight on idle ranks: ties go in one rotation across the replicas") {
    std::vector<std::size_t> seen;
    for (int i = 0; i < 8; ++i) {
      auto& r = *replicas[static_cast<std::size_t>(i) % 2];
      const auto p = pick_now(io, r, ranks, ledger_policy::least_inflight);
      REQUIRE(p.rank);
      seen.push_back(*p.rank);
      r.release(*p.rank);  // idle again: every pick is a four-way tie
    }
    CHECK(seen == std::vector<std::size_t>{0, 1, 2, 3, 0, 1, 2, 3});
  }

  SECTION("round-robin through two replicas taking turns is one rotation") {
    std::vector<std::size_t> seen;
    for (int i = 0; i < 10; ++i) {
      const auto p = pick_now(io, *replicas[static_cast<std::size_t>(i) % 2], ranks, ledger_policy::round_robin);
      REQUIRE(p.ok);
      REQUIRE(p.rank);
      seen.push_back(*p.rank);
    }
    CHECK(seen == std::vector<std::size_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1});
  }
}

TEST_CASE("the per-rank limit holds over all replicas, and a slot freed through one is heard by the others",
          "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  replica a(io, redis.port(), "a", "limit");
  replica b(io, redis.port(), "b", "limit");
  REQUIRE(run_until(io, [&] { return a.ledger->up() && b.ledger->up() && a.ledger->subscribed(); }));
  const auto ranks = equal_ranks(2);

  const auto first = pick_now(io, a, ranks, ledger_policy::least_inflight, 1);
  const auto second = pick_now(io, b, ranks, ledger_policy::least_inflight, 1);
  REQUIRE(first.rank);
  REQUIRE(second.rank);
  CHECK(*first.rank != *second.rank);
  CHECK(second.counts == std::vector<std::uint32_t>{*first.rank == 0 ? 1u : 0u, *first.rank == 1 ? 1u : 0u});

  // Both ranks hold one request, one through each replica: neither may take a second.
  const auto full_a = pick_now(io, a, ranks, ledger_policy::least_inflight, 1);
  const auto full_b = pick_now(io, b, ranks, ledger_policy::round_robin, 1);
  CHECK(full_a.ok);
  CHECK_FALSE(full_a.rank);
  CHECK(full_b.ok);
  CHECK_FALSE(full_b.rank);

  // b's release frees its slot for a, which hears of it through the subscription.
  const auto released = steady::now();
  b.release(*second.rank);
  REQUIRE(run_until(io, [&] { return !a.freed.empty(); }, milliseconds(1000)));
  CHECK(steady::now() - released <= scaled(milliseconds(20)));
  CHECK(a.freed.front() == *second.rank);
  const auto again = pick_now(io, a, ranks, ledger_policy::least_inflight, 1);
  REQUIRE(again.rank);
  CHECK(*again.rank == *second.rank);

  // A release of a slot the replica does not hold changes nothing.
  b.ledger->release(*first.rank);
  const auto v = view_of(io, a);
  CHECK(v.total == std::map<std::size_t, std::uint32_t>{{0, 1}, {1, 1}});
}

TEST_CASE("a replica that stops renewing leaves the ledger within its lease", "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  const auto short_lease = [](ledger_options& o) {
    o.lease = milliseconds(600);
    o.renew_every = milliseconds(100);
  };
  replica a(io, redis.port(), "a", "lease", short_lease);
  auto c = std::make_unique<replica>(io, redis.port(), "c", "lease", short_lease);
  REQUIRE(run_until(io, [&] { return a.ledger->up() && c->ledger->up(); }));
  const auto ranks = equal_ranks(4);
  for (int i = 0; i < 3; ++i) REQUIRE(pick_now(io, *c, ranks, ledger_policy::round_robin).rank);
  REQUIRE(pick_now(io, a, ranks, ledger_policy::round_robin).rank == std::optional<std::size_t>(3));
  auto v = view_of(io, a);
  CHECK(v.replicas == 2);
  CHECK(v.total == std::map<std::size_t, std::uint32_t>{{0, 1}, {1, 1}, {2, 1}, {3, 1}});

  c.reset();  // c dies without a word: no release, no renewal
  const auto died = steady::now();
  REQUIRE(run_until(io, [&] {
    v = view_of(io, a);
    return v.replicas == 1;
  }, milliseconds(3000)));
  const auto took = steady::now() - died;
  CHECK(took <= scaled(milliseconds(600 + 250)));
  CHECK(v.total == std::map<std::size_t, std::uint32_t>{{3, 1}});
}

TEST_CASE("registrations give a server flushed or restarted empty every replica's counts back, and a replica "
          "restarted under its name replaces its old counts",
          "[ledger]") {
  auto redis = std::make_unique<redis_server>();
  const auto port = redis->port();
  boost::asio::io_context io;
  const auto renew_fast = [](ledger_options& o) { o.renew_every = milliseconds(100); };
  replica a(io, port, "a", "restart", renew_fast);
  replica b(io, port, "b", "restart", renew_fast);
  a.in_flight = {{0, 3}, {1, 1}};  // e.g. picked by its own counts while Redis was away
  b.in_flight = {{2, 2}};
  REQUIRE(run_until(io, [&] { return a.ledger->up() && b.ledger->up(); }));
  const std::map<std::size_t, std::uint32_t> both{{0, 3}, {1, 1}, {2, 2}};
  ledger_view v;
  const auto ledger_holds = [&](const std::map<std::size_t, std::uint32_t>& want) {
    return run_until(io, [&] {
      v = view_of(io, a);
      return v.total == want;
    }, milliseconds(2000));
  };
  CHECK(ledger_holds(both));

  SECTION("FLUSHALL") {
    REQUIRE(raw_command(io, port, {"FLUSHALL"}).ok);
    CHECK(ledger_holds(both));
  }

  SECTION("the keys expire once no replica registers any more") {
    pick_now(io, a, equal_ranks(4), ledger_policy::round_robin);  // group 0's cursor: it expires with its picks
    for (const char* key : {"{dplb:restart}:replicas", "{dplb:restart}:total", "{dplb:restart}:rr:0", "{dplb:restart}:r:b"}) {
      INFO(key);
      long long ttl = -1;
      CHECK(run_until(io, [&] {
        ttl = raw_command(io, port, {"PTTL", key}).reply.integer;
        return ttl > 0;
      }, milliseconds(1000)));
      CHECK(ttl <= 600000);
    }
  }

  SECTION("a server restarted empty") {
    redis->stop();
    REQUIRE(run_until(io, [&] { return !a.ledger->up() && !b.ledger->up(); }));
    CHECK_FALSE(pick_now(io, a, equal_ranks(4), ledger_policy::least_inflight).ok);
    redis = std::make_unique<redis_server>(port);
    const auto back = steady::now();
    REQUIRE(run_until(io, [&] { return a.ledger->up() && b.ledger->up(); }));
    CHECK(steady::now() - back <= scaled(milliseconds(5000)));
    CHECK(ledger_holds(both));
    // The function library came back with the connect: picks are exact again.
    const auto p = pick_now(io, b, equal_ranks(4), ledger_policy::least_inflight);
    CHECK(p.rank == std::optional<std::size_t>(3));
  }

  SECTION("a replica restarted under the same name") {
    a.ledger.reset();  // the old incarnation dies without a word; its counts are still in the ledger
    replica a_again(io, port, "a", "restart", renew_fast);
    a_again.in_flight = {{1, 1}};
    REQUIRE(run_until(io, [&] { return a_again.ledger->up(); }));
    const auto v2 = view_of(io, a_again);
    CHECK(v2.replicas == 2);
    CHECK(v2.total == std::map<std::size_t, std::uint32_t>{{1, 1}, {2, 2}});
  }
}

TEST_CASE("a paused Redis costs a pick at most its timeout, and the client comes back when Redis does", "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  replica a(io, redis.port(), "a", "pause", [](ledger_options& o) {
    o.timeout = milliseconds(20);
    o.connect_timeout = milliseconds(200);
  });
  REQUIRE(run_until(io, [&] { return a.ledger->up(); }));
  const auto ranks = equal_ranks(4);
  REQUIRE(pick_now(io, a, ranks, ledger_policy::least_inflight).ok);

  REQUIRE(::kill(redis.pid(), SIGSTOP) == 0);
  struct resume {
    pid_t pid;
    ~resume() { ::kill(pid, SIGCONT); }
  } resume_on_exit{redis.pid()};
  const auto sent = steady::now();
  const auto p = pick_now(io, a, ranks, ledger_policy::least_inflight);
  const auto took = steady::now() - sent;
  CHECK_FALSE(p.ok);
  CHECK(took >= milliseconds(20));
  CHECK(took <= scaled(milliseconds(20 + 30)));
  CHECK(a.ledger->errors(ledger_op::pick) == 1);
  REQUIRE(run_until(io, [&] { return !a.ledger->up(); }, milliseconds(100)));
  // Down: a pick fails at once, with no timeout.
  const auto down_sent = steady::now();
  CHECK_FALSE(pick_now(io, a, ranks, ledger_policy::least_inflight).ok);
  CHECK(steady::now() - down_sent <= scaled(milliseconds(10)));

  REQUIRE(::kill(redis.pid(), SIGCONT) == 0);
  REQUIRE(run_until(io, [&] { return a.ledger->up(); }, milliseconds(5000)));
  const auto again = pick_now(io, a, ranks, ledger_policy::least_inflight);
  CHECK(again.ok);
  CHECK(again.rank);
}

TEST_CASE("the Redis password is used, and never shown in an error or the log", "[ledger]") {
  redis_server redis(0, {"--requirepass", "right-horse-battery"});
  boost::asio::io_context io;
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("ledger-test", std::make_shared<spdlog::sinks::ostream_sink_st>(log)));
  struct restore {
    std::shared_ptr<spdlog::logger> logger;
    ~restore() { spdlog::set_default_logger(logger); }
  } restore_on_exit{previous};

  std::vector<std::string> errors;
  const auto client_with = [&](std::string password) {
    redis_client_options o;
    o.endpoint = parse_redis_url("redis://127.0.0.1:" + std::to_string(redis.port()), password);
    o.backoff_min = o.backoff_max = milliseconds(50);
    auto c = std::make_unique<redis_client>(io, o);
    c->on_error([&](std::string_view op, std::string_view why) { errors.push_back(std::string(op) + ": " + std::string(why)); });
    c->start();
    return c;
  };
  {
    auto wrong = client_with("wrong-staple-s3cret");
    REQUIRE(run_until(io, [&] { return errors.size() >= 2; }));
    CHECK_FALSE(wrong->up());
  }
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.find("wrong-staple-s3cret") == std::string::npos);
    CHECK(e.find("connect") == 0);
  }
  CHECK(log.str().find("wrong-staple-s3cret") == std::string::npos);
  CHECK(log.str().find("no ledger at Redis") != std::string::npos);

  auto right = client_with("right-horse-battery");
  REQUIRE(run_until(io, [&] { return right->up(); }));
  CHECK(log.str().find("right-horse-battery") == std::string::npos);
}

TEST_CASE("a registration asked for while picks wait for their answers is sent after them, with them counted",
          "[ledger]") {
  // The picks are recorded in Redis before their answers reach the replica: a registration sent in
  // between would carry counts without them and take them out of the ledger again.
  redis_server redis;
  boost::asio::io_context io;
  replica a(io, redis.port(), "a", "settle");
  REQUIRE(run_until(io, [&] { return a.ledger->up(); }));
  const auto ranks = equal_ranks(4);
  int answers = 0;
  for (int i = 0; i < 8; ++i) a.pick(ranks, ledger_policy::least_inflight, 0, [&](const ledger_pick&) { ++answers; });
  a.ledger->register_in_flight();
  REQUIRE(run_until(io, [&] { return answers == 8; }));
  CHECK(a.in_flight == std::map<std::size_t, std::uint32_t>{{0, 2}, {1, 2}, {2, 2}, {3, 2}});
  CHECK(view_of(io, a).total == a.in_flight);
}

TEST_CASE("a rate limit shared by the replicas holds over all of them together", "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  replica a(io, redis.port(), "a", "buckets");
  replica b(io, redis.port(), "b", "buckets");
  REQUIRE(run_until(io, [&] { return a.ledger->up() && b.ledger->up(); }));
  const auto take = [&](replica& r, const shared_ledger::bucket_spec& bucket, std::uint64_t units) {
    std::optional<bucket_answer> answer;
    r.ledger->take(bucket, units, [&](const bucket_answer& got) { answer = got; });
    REQUIRE(run_until(io, [&] { return answer.has_value(); }));
    REQUIRE(answer->ok);
    return *answer;
  };

  SECTION("a burst of 5 is 5 requests through both replicas, not 5 each") {
    const shared_ledger::bucket_spec requests{"tenant-x:requests", 0.01, 5};  // one back every 100 s
    int taken = 0;
    for (int i = 0; i < 10; ++i) {
      const auto answer = take(i % 2 ? b : a, requests, 1);
      if (answer.taken) ++taken;
      else CHECK(answer.retry_after > milliseconds(0));
    }
    CHECK(taken == 5);
    // A reservation's unused units come back, to whichever replica takes next.
    a.ledger->give_back(requests, 1);
    view_of(io, a);  // answered after the give-back, sent on the same connection before it
    CHECK(take(b, requests, 1).taken);
    CHECK_FALSE(take(a, requests, 1).taken);
  }

  SECTION("more than the burst is never taken; a charge beyond it leaves a debt") {
    const shared_ledger::bucket_spec tokens{"tenant-x:tokens", 100, 10};
    const auto too_big = take(a, tokens, 11);
    CHECK_FALSE(too_big.taken);
    CHECK_FALSE(too_big.retry_after.has_value());
    CHECK(take(a, tokens, 10).taken);
    b.ledger->charge(tokens, 5);  // a's request used 5 more than it reserved: 5 in debt
    view_of(io, b);
    const auto in_debt = take(a, tokens, 1);
    CHECK_FALSE(in_debt.taken);
    CHECK(in_debt.retry_after >= milliseconds(50));  // 6 units at 100 a second
    CHECK(in_debt.retry_after <= milliseconds(60));
  }

  SECTION("buckets taken together: from every one or from none, naming the one that refused") {
    const shared_ledger::bucket_spec requests{"tenant-z:requests", 0.01, 3};
    const shared_ledger::bucket_spec tokens{"tenant-z:tokens", 0.01, 100};
    const auto take_both = [&](replica& r, std::uint64_t token_units) {
      const std::vector<shared_ledger::bucket_take> takes{{requests, 1}, {tokens, token_units}};
      std::optional<bucket_answer> answer;
      r.ledger->take(takes, [&](const bucket_answer& got) { answer = got; });
      REQUIRE(run_until(io, [&] { return answer.has_value(); }));
      REQUIRE(answer->ok);
      return *answer;
    };
    CHECK(take_both(a, 60).taken);
    const auto over_budget = take_both(b, 60);  // 40 tokens left
    CHECK_FALSE(over_budget.taken);
    CHECK(over_budget.refused == 1);
    CHECK(over_budget.retry_after.has_value());
    // That refusal took no request from the request bucket: two more fit, 20 tokens each.
    CHECK(take_both(b, 20).taken);
    CHECK(take_both(a, 20).taken);
    const auto over_rate = take_both(b, 0);
    CHECK_FALSE(over_rate.taken);
    CHECK(over_rate.refused == 0);
  }

  SECTION("the bucket refills at its rate") {
    const shared_ledger::bucket_spec fast{"tenant-y:requests", 50, 1};  // one every 20 ms
    CHECK(take(a, fast, 1).taken);
    const auto refused = take(b, fast, 1);
    REQUIRE_FALSE(refused.taken);
    REQUIRE(refused.retry_after);
    CHECK(*refused.retry_after <= milliseconds(20));
    // Awaiting the time the bucket named: then b gets it.
    const auto at = steady::now() + *refused.retry_after;
    REQUIRE(run_until(io, [&] { return steady::now() >= at; }, milliseconds(1000)));
    CHECK(take(b, fast, 1).taken);
  }
}

TEST_CASE("least-tokens weighs every replica's tokens, and the tokens leave with the prompt and the release",
          "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  replica a(io, redis.port(), "a", "tokens");
  replica b(io, redis.port(), "b", "tokens");
  REQUIRE(run_until(io, [&] { return a.ledger->up() && b.ledger->up(); }));
  const auto ranks = equal_ranks(2);
  const auto pick_tokens = [&](replica& r, request_tokens cost) {
    std::optional<ledger_pick> p;
    r.pick(ranks, 0, cost, [&](const ledger_pick& got) { p = got; });
    REQUIRE(run_until(io, [&] { return p.has_value(); }));
    REQUIRE(p->ok);
    REQUIRE(p->rank);
    return *p->rank;
  };

  CHECK(pick_tokens(a, {8000, 16}) == 0);  // a long prompt through a
  CHECK(pick_tokens(b, {10, 0}) == 1);
  // One request on each rank: least-inflight's rotation would now say rank 0; least-tokens sees a's prompt
  // through b, 8,000 tokens more than a slot's worth, and says rank 1.
  CHECK(pick_tokens(b, {10, 0}) == 1);
  auto v = view_of(io, b);
  CHECK(v.load[0] == rank_load{1, 8000, 8016});
  CHECK(v.load[1] == rank_load{2, 20, 20});

  a.prompt_done(0, 8000);
  v = view_of(io, a);
  CHECK(v.load[0] == rank_load{1, 0, 16});  // the prompt leaves the cost too, as in the balancer's counts
  a.release(0, 0, 16);
  v = view_of(io, a);
  CHECK(v.load.count(0) == 0);
  // A registration carries the tokens too: b's stay as they are.
  b.ledger->register_in_flight();
  v = view_of(io, b);
  CHECK(v.load[1] == rank_load{2, 20, 20});
}

TEST_CASE("least-load weighs the larger of every replica's requests and the engine's floor", "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  replica a(io, redis.port(), "a", "load");
  replica b(io, redis.port(), "b", "load");
  REQUIRE(run_until(io, [&] { return a.ledger->up() && b.ledger->up(); }));
  // Rank 0's engine reports 3 requests that no replica sent (clients that bypass dplb): it takes none until
  // the others have 3 each; then the four ranks fill evenly.
  auto ranks = equal_ranks(4);
  ranks[0].floor = 3;
  std::map<std::size_t, int> picked;
  for (int i = 0; i < 13; ++i) {
    std::optional<ledger_pick> p;
    (i % 2 == 0 ? a : b).pick(ranks, ledger_policy::least_load, 0, [&](const ledger_pick& got) { p = got; });
    REQUIRE(run_until(io, [&] { return p.has_value(); }));
    REQUIRE(p->ok);
    REQUIRE(p->rank);
    ++picked[*p->rank];
    if (i < 9) CHECK(*p->rank != 0);  // 3 each on ranks 1-3 first, through either replica
  }
  CHECK(picked == std::map<std::size_t, int>{{0, 1}, {1, 4}, {2, 4}, {3, 4}});
  // A floor below the replicas' count changes nothing: the live count is the load.
  ranks[0].floor = 1;
  std::optional<ledger_pick> p;
  a.pick(ranks, ledger_policy::least_load, 0, [&](const ledger_pick& got) { p = got; });
  REQUIRE(run_until(io, [&] { return p.has_value(); }));
  REQUIRE(p->rank);
  CHECK(*p->rank == 0);  // 1 on rank 0 against 4 elsewhere
}

TEST_CASE("each group of ranks rotates on its own, and a pick with one candidate takes no turn", "[ledger]") {
  redis_server redis;
  boost::asio::io_context io;
  replica a(io, redis.port(), "a", "groups");
  REQUIRE(run_until(io, [&] { return a.ledger->up(); }));
  const std::vector<ledger_candidate> first{{0, 1.0}, {1, 1.0}};   // cluster 0's ranks
  const std::vector<ledger_candidate> second{{2, 1.0}, {3, 1.0}};  // cluster 1's
  const std::vector<ledger_candidate> pinned{{1, 1.0}};
  const auto pick_in = [&](const std::vector<ledger_candidate>& ranks, std::size_t group) {
    std::optional<ledger_pick> p;
    a.ledger->pick(ranks, ledger_policy::round_robin, 0, {}, group, [&](const ledger_pick& got) { p = got; });
    REQUIRE(run_until(io, [&] { return p.has_value(); }));
    REQUIRE(p->rank);
    return *p->rank;
  };
  std::vector<std::size_t> got;
  for (int i = 0; i < 4; ++i) {
    got.push_back(pick_in(first, 0));
    got.push_back(pick_in(second, 1));
    got.push_back(pick_in(pinned, 0));  // a pinned request in between: no turn of cluster 0's taken
  }
  // With one cursor for all, cluster 1's picks would leave it past rank 1, and cluster 0 would get rank 0
  // every time.
  CHECK(got == std::vector<std::size_t>{0, 2, 1, 1, 3, 1, 0, 2, 1, 1, 3, 1});
}
