// How a session waits for the shared ledger's thread (src/server/ledger_wait.hpp): an answer in time is the
// session's; one that comes after the session stopped waiting goes to the caller's `dropped`, so that what it
// took (a tenant's bucket units) can be given back.

#include <catch2/catch.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <functional>
#include <optional>

#include "../../../src/server/ledger_wait.hpp"

using namespace std::chrono_literals;
using dplb::server::await_ledger;

namespace {

struct outcome {
  bool done = false;
  std::optional<int> answer;
};

void wait_for(boost::asio::io_context& io, outcome& out, std::chrono::milliseconds give_up_after,
              std::function<void(std::function<void(int)>)> ask, std::function<void(int&&)> dropped) {
  boost::asio::co_spawn(
      io,
      [&out, &io, give_up_after, ask, dropped]() -> dplb::io::task<void> {
        out.answer = co_await await_ledger<int>(io.get_executor(), give_up_after, ask, dropped);
        out.done = true;
      },
      boost::asio::detached);
}

}  // namespace

TEST_CASE("await_ledger: an answer in time is the session's, and nothing is dropped", "[server][ledger]") {
  boost::asio::io_context io;
  outcome out;
  int dropped = 0;
  wait_for(io, out, 10s, [](std::function<void(int)> reply) { reply(5); }, [&](int&&) { ++dropped; });
  io.run_for(5s);
  REQUIRE(out.done);
  CHECK(out.answer == 5);
  CHECK(dropped == 0);
}

TEST_CASE("await_ledger: an answer after the session gave up goes to `dropped`", "[server][ledger]") {
  boost::asio::io_context io;
  outcome out;
  std::function<void(int)> late;
  std::optional<int> dropped;
  wait_for(io, out, 10ms, [&](std::function<void(int)> reply) { late = std::move(reply); },
           [&](int&& answer) { dropped = answer; });
  io.run_for(5s);  // the 10 ms pass without an answer: the wait ends empty
  REQUIRE(out.done);
  CHECK_FALSE(out.answer.has_value());
  REQUIRE(late);
  late(7);  // the ledger answers now, too late
  io.restart();
  io.run_for(1s);
  CHECK(dropped == 7);
}
