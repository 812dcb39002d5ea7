#include <catch2/catch.hpp>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <array>
#include <chrono>
#include <memory>
#include <optional>

#include "dplb/server/deadline_sweeper.hpp"

namespace asio = boost::asio;
using namespace dplb;
using namespace std::chrono_literals;

namespace {

// A connected pair of sockets on loopback, the first bound to the io_context's executor type dplb uses.
struct socket_pair {
  explicit socket_pair(asio::io_context& io) : ours(io.get_executor()), peer(io) {
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
    ours.connect(acceptor.local_endpoint());
    acceptor.accept(peer);
  }
  io::socket ours;
  asio::ip::tcp::socket peer;
};

// A one-byte-or-more receive on a socket, and what it completed with.
struct pending_read {
  explicit pending_read(io::socket& socket) {
    socket.async_receive(asio::buffer(buffer), [this](const boost::system::error_code& ec, std::size_t) { result = ec; });
  }
  // Runs the loop until the read completes, for 5 s at most.
  void wait(asio::io_context& io) {
    while (!result && io.run_one_for(5s)) {
    }
  }
  std::array<char, 8> buffer{};
  std::optional<boost::system::error_code> result;
};

}  // namespace

TEST_CASE("a deadline that passes closes its socket, and its pending read fails", "[server][deadline]") {
  asio::io_context io;
  server::deadline_sweeper sweeper(io.get_executor(), 5ms);
  sweeper.start();
  socket_pair timed(io);
  socket_pair untimed(io);
  server::socket_deadline deadline(sweeper);
  server::socket_deadline other(sweeper);  // no deadline set: its socket stays open
  deadline.guard(&timed.ours);
  other.guard(&untimed.ours);
  const auto started = std::chrono::steady_clock::now();  // before the deadline is set: it counts from then
  deadline.expires_after(20ms);

  pending_read read(timed.ours);
  read.wait(io);
  REQUIRE(read.result);
  CHECK(*read.result == asio::error::operation_aborted);
  CHECK(deadline.expired());
  CHECK_FALSE(timed.ours.is_open());
  CHECK(std::chrono::steady_clock::now() - started >= 20ms);  // never early
  CHECK_FALSE(other.expired());
  CHECK(untimed.ours.is_open());
  sweeper.stop();
}

TEST_CASE("a deadline cleared before it passes closes nothing", "[server][deadline]") {
  asio::io_context io;
  server::deadline_sweeper sweeper(io.get_executor(), 5ms);
  sweeper.start();
  socket_pair pair(io);
  server::socket_deadline deadline(sweeper);
  deadline.guard(&pair.ours);
  deadline.expires_after(10ms);
  deadline.expires_never();
  // Several sweeps later (a timer of the test's own marks the time; nothing waits on a sleep).
  io::steady_timer later(io.get_executor());
  later.expires_after(60ms);
  bool waited = false;
  later.async_wait([&](const boost::system::error_code&) { waited = true; });
  while (!waited && io.run_one_for(5s)) {
  }
  CHECK(waited);
  CHECK_FALSE(deadline.expired());
  CHECK(pair.ours.is_open());
  sweeper.stop();
}

TEST_CASE("deadlines come and go in any order, and may outlive their sweeper", "[server][deadline]") {
  asio::io_context io;
  std::optional<server::deadline_sweeper> sweeper;
  sweeper.emplace(io.get_executor(), 5ms);
  sweeper->start();
  socket_pair pair(io);
  auto first = std::make_unique<server::socket_deadline>(*sweeper);
  auto second = std::make_unique<server::socket_deadline>(*sweeper);
  auto third = std::make_unique<server::socket_deadline>(*sweeper);
  second.reset();  // from the middle: the last takes its place
  third->guard(&pair.ours);
  third->expires_after(1ms);
  pending_read read(pair.ours);
  read.wait(io);
  CHECK(third->expired());  // still swept after the move
  CHECK_FALSE(first->expired());
  sweeper.reset();  // as when a worker is torn down before its sessions' frames
  first.reset();
  third.reset();
  SUCCEED("no deadline touched the destroyed sweeper");
}

TEST_CASE("the sweep period follows the shortest timeout", "[server][deadline]") {
  config::settings settings;
  CHECK(server::deadline_sweeper::period_for(settings) == 25ms);  // defaults: seconds-long timeouts
  settings.upstream_first_byte_timeout = 40ms;
  CHECK(server::deadline_sweeper::period_for(settings) == 10ms);
  settings.client_write_timeout = 1ms;
  CHECK(server::deadline_sweeper::period_for(settings) == 5ms);
}

TEST_CASE("a sweeper with nothing due arms no timer: an idle worker is never woken", "[server][deadline]") {
  asio::io_context io;
  server::deadline_sweeper sweeper(io.get_executor(), 5ms);
  sweeper.start();
  socket_pair pair(io);
  server::socket_deadline deadline(sweeper);
  deadline.guard(&pair.ours);
  CHECK(sweeper.next_sweep() == server::deadline_sweeper::clock_type::time_point::max());
  // run() returns as soon as nothing is pending; a sweeper that re-armed itself would keep it to the bound.
  io.run_for(5s);
  CHECK(io.stopped());

  // A deadline that passes is swept once; with nothing due after it, the loop runs out of work again.
  io.restart();
  deadline.expires_after(10ms);
  CHECK(sweeper.next_sweep() != server::deadline_sweeper::clock_type::time_point::max());
  io.run_for(5s);
  CHECK(io.stopped());
  CHECK(deadline.expired());
  CHECK_FALSE(pair.ours.is_open());
  sweeper.stop();
}

TEST_CASE("a sweeper asleep until a far deadline wakes for a nearer one", "[server][deadline]") {
  asio::io_context io;
  server::deadline_sweeper sweeper(io.get_executor(), 5ms);
  sweeper.start();
  socket_pair far_pair(io);
  socket_pair near_pair(io);
  server::socket_deadline far_deadline(sweeper);
  server::socket_deadline near_deadline(sweeper);
  far_deadline.guard(&far_pair.ours);
  near_deadline.guard(&near_pair.ours);
  far_deadline.expires_after(std::chrono::minutes(10));
  const auto far_sweep = sweeper.next_sweep();
  const auto started = std::chrono::steady_clock::now();  // before the deadline is set: it counts from then
  near_deadline.expires_after(20ms);
  CHECK(sweeper.next_sweep() < far_sweep);

  pending_read read(near_pair.ours);
  read.wait(io);
  REQUIRE(read.result);
  CHECK(std::chrono::steady_clock::now() - started >= 20ms);  // never early
  CHECK(near_deadline.expired());
  CHECK_FALSE(far_deadline.expired());
  CHECK(far_pair.ours.is_open());
  // Asleep again until the far one.
  CHECK(sweeper.next_sweep() >= far_sweep);
  sweeper.stop();
}

TEST_CASE("what a sweep's wake-up sets on a deadline already swept is kept", "[server][deadline]") {
  asio::io_context io;
  server::deadline_sweeper sweeper(io.get_executor(), 5ms);
  sweeper.start();
  socket_pair pair(io);
  server::socket_deadline timed(sweeper);   // walked first
  server::socket_deadline waking(sweeper);  // its wake-up sets `timed`'s deadline
  timed.guard(&pair.ours);
  struct context {
    server::socket_deadline* timed;
    bool woken = false;
  } ctx{&timed};
  waking.wake_at(server::deadline_sweeper::clock_type::now() + 5ms, [](void* c) {
    auto& ctx = *static_cast<context*>(c);
    ctx.woken = true;
    ctx.timed->expires_after(15ms);
  }, &ctx);
  pending_read read(pair.ours);
  io.run_for(5s);  // runs out of work once `timed` has been swept
  CHECK(io.stopped());
  CHECK(ctx.woken);
  REQUIRE(read.result);
  CHECK(timed.expired());
  sweeper.stop();
}
