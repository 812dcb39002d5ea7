// The engine-stats poller against engines that answer when the test says: what dplb sends while a read
// is on the wire must not be counted twice, once live and once in the engine's numbers.

#include <catch2/catch.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/support/supervisor.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/engine_stats_poller.hpp"

using namespace std::chrono_literals;
using namespace dplb;
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// One engine's /metrics: takes the first read, tells the test it arrived, and answers with the page
// `page()` gives once the test opens `answer` (cancels it).
struct held_engine {
  explicit held_engine(asio::io_context& io) : acceptor(io, {asio::ip::make_address("127.0.0.1"), 0}), answer(io) {
    answer.expires_at(std::chrono::steady_clock::time_point::max());
  }
  std::uint16_t port() const { return acceptor.local_endpoint().port(); }

  asio::awaitable<void> serve_one_read() {
    auto socket = co_await acceptor.async_accept(asio::use_awaitable);
    std::string request;
    co_await asio::async_read_until(socket, asio::dynamic_buffer(request), "\r\n\r\n", asio::use_awaitable);
    read_arrived = true;
    co_await answer.async_wait(asio::as_tuple(asio::use_awaitable));
    const std::string body = page();
    const std::string response = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    co_await asio::async_write(socket, asio::buffer(response), asio::use_awaitable);
  }

  tcp::acceptor acceptor;
  asio::steady_timer answer;
  bool read_arrived = false;
  std::function<std::string()> page;
};

std::string running_page(std::uint32_t running) {
  return "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} " + std::to_string(running) +
         "\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n";
}

// Runs the io_context until `done` holds; false when it does not within a few seconds.
bool run_until(asio::io_context& io, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    io.run_one_for(100ms);
  }
  return true;
}

}  // namespace

TEST_CASE("requests dplb sends while an engine-stats read is on the wire are not counted twice", "[engine-stats]") {
  // Two idle ranks. Both reads leave; before either engine answers, dplb places a burst of 8 (4 each).
  // Rank 0's engine has received its 4 when it answers; rank 1's has received none of its 4 yet (they are
  // still on their way). Neither reports a request dplb did not send: the ranks carry 4 each, alike, and
  // the next two requests go one to each. Counting rank 0's 4 again (as load "beyond what dplb had in
  // flight when the read left") would send both to rank 1. Load rank 0's engine has beyond dplb's own
  // (`extra`, from another replica) still counts: the next `extra` go to rank 1 first.
  const std::uint32_t extra = GENERATE(0u, 3u);
  INFO("rank 0's engine reports " << extra << " request(s) dplb did not send");
  balancer::balancer b(2, balancer::make_policy("least-load"));
  upstream::topology topology;
  asio::io_context io;
  std::vector<std::unique_ptr<held_engine>> engines;
  for (std::size_t r = 0; r < 2; ++r) {
    engines.push_back(std::make_unique<held_engine>(io));
    upstream::backend backend;
    backend.host = "127.0.0.1";
    backend.port = engines.back()->port();
    backend.authority = "127.0.0.1:" + std::to_string(backend.port);
    backend.url = "http://" + backend.authority;
    backend.host_line = "Host: " + backend.authority + "\r\n";
    backend.endpoints = {engines.back()->acceptor.local_endpoint()};
    topology.add(std::move(backend), 1, 0);
  }
  engines[0]->page = [extra] { return running_page(4 + extra); };
  engines[1]->page = [] { return running_page(0); };

  upstream::engine_stats_poller poller(topology, b, 1h, 5s);  // one round in this test
  for (auto& e : engines) asio::co_spawn(io, e->serve_one_read(), asio::detached);
  support::supervisor supervisor;
  poller.start(io.get_executor(), supervisor);
  REQUIRE(run_until(io, [&] { return engines[0]->read_arrived && engines[1]->read_arrived; }));

  std::vector<balancer::rank_lease> burst;
  for (int i = 0; i < 8; ++i) burst.push_back(b.acquire());
  REQUIRE(b.inflight(0) == 4);
  REQUIRE(b.inflight(1) == 4);

  for (auto& e : engines) e->answer.cancel();
  REQUIRE(run_until(io, [&] { return b.engine_stats_of(0).ever && b.engine_stats_of(1).ever; }));
  CHECK(b.engine_stats_of(0).load.running == 4 + extra);

  for (std::uint32_t i = 0; i < 2 + extra; ++i) burst.push_back(b.acquire());
  CHECK(b.inflight(0) == 5);
  CHECK(b.inflight(1) == 5 + extra);
  poller.stop();
}
