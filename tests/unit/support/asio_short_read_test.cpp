// The surface of cmake/AsioOverride.cmake: Asio's reactor takes a read that returned fewer bytes than
// asked for as "nothing left" and waits for the next epoll edge before reading again. Every case where
// no edge will come must still complete: data and FIN (or RST) reported in one event, MSG_PEEK (peeked
// bytes stay), a buffer filled exactly. Each read is bounded: a reader left waiting for an edge fails
// the test instead of hanging it. They hold on Asio as installed too (the override off, or not matching
// this Boost), where every read is retried: nothing here is the override's alone, so nothing is skipped.
#include <catch2/catch.hpp>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/socket_base.hpp>
#include <boost/asio/write.hpp>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "dplb/support/asio_override_check.hpp"  // with the override, stops the build on Boost's own copy
#include "dplb/support/io_types.hpp"

namespace asio = boost::asio;
using namespace dplb;
using namespace std::chrono_literals;

namespace {

struct read_result {
  boost::system::error_code ec;
  std::string bytes;
};

// A connected pair on loopback: `ours` on dplb's socket type, `peer` written with blocking calls (on
// loopback a send has reached the other socket's queue when it returns).
struct connection {
  explicit connection(asio::io_context& io) : ours(io.get_executor()), peer(io) {
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
    ours.connect(acceptor.local_endpoint());
    acceptor.accept(peer);
  }

  // Starts a read of up to `size` bytes; run() completes it.
  void start_read(std::size_t size, asio::socket_base::message_flags flags = 0) {
    result.reset();
    buffer.assign(size, '\0');
    ours.async_receive(asio::buffer(buffer), flags, [this](const boost::system::error_code& ec, std::size_t n) {
      result = read_result{ec, buffer.substr(0, n)};
    });
  }

  // Runs the loop until the read completes, for 5 s at most.
  read_result run(asio::io_context& io) {
    io.restart();
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!result && std::chrono::steady_clock::now() < deadline && io.run_one_for(deadline - std::chrono::steady_clock::now())) {
    }
    REQUIRE(result);  // otherwise the read waited for an edge that never came
    return *result;
  }

  io::socket ours;
  asio::ip::tcp::socket peer;
  std::string buffer;
  std::optional<read_result> result;
};

}  // namespace

TEST_CASE("a short read followed by the peer's FIN in the same event: the next read sees the end at once",
          "[asio]") {
  asio::io_context io;
  connection c(io);
  c.start_read(64);  // nothing to read yet: it waits in the reactor
  asio::write(c.peer, asio::buffer(std::string_view("hello")));
  c.peer.shutdown(asio::socket_base::shutdown_send);  // data and FIN queued before the reactor looks
  const auto first = c.run(io);
  CHECK_FALSE(first.ec);
  CHECK(first.bytes == "hello");  // a short read
  c.start_read(64);
  CHECK(c.run(io).ec == asio::error::eof);
}

TEST_CASE("a short read followed by the peer's reset in the same event: the next read fails at once", "[asio]") {
  asio::io_context io;
  connection c(io);
  c.start_read(64);
  asio::write(c.peer, asio::buffer(std::string_view("hello")));
  c.peer.set_option(asio::socket_base::linger(true, 0));
  c.peer.close();  // RST
  const auto first = c.run(io);
  // Linux may drop the queued bytes when the reset arrives; either way, no read may wait for an edge.
  if (!first.ec) {
    CHECK(first.bytes == "hello");
    c.start_read(64);
    const auto second = c.run(io);
    CHECK((second.ec == asio::error::connection_reset || second.ec == asio::error::eof));
  } else {
    CHECK((first.ec == asio::error::connection_reset || first.ec == asio::error::eof));
  }
}

TEST_CASE("the peer's FIN seen by the reactor before a short read: reads after it never wait", "[asio]") {
  asio::io_context io;
  connection c(io);
  asio::write(c.peer, asio::buffer(std::string_view("hello")));
  c.peer.shutdown(asio::socket_base::shutdown_send);
  // Let the reactor take the event while no read is waiting (a posted handler makes poll() run it).
  asio::post(io, [] {});
  io.poll();
  c.start_read(2);  // fills its buffer: not short
  CHECK(c.run(io).bytes == "he");
  c.start_read(64);  // short
  CHECK(c.run(io).bytes == "llo");
  c.start_read(64);
  CHECK(c.run(io).ec == asio::error::eof);
}

TEST_CASE("a short MSG_PEEK read leaves its bytes, and the next read gets them at once", "[asio]") {
  asio::io_context io;
  connection c(io);
  c.start_read(64, asio::socket_base::message_peek);
  asio::write(c.peer, asio::buffer(std::string_view("hello")));
  CHECK(c.run(io).bytes == "hello");
  c.start_read(64);  // no new data will arrive: the bytes peeked are all there is
  CHECK(c.run(io).bytes == "hello");
}

TEST_CASE("a read that fills its buffer leaves the rest readable at once, and a short one waits for more", "[asio]") {
  asio::io_context io;
  connection c(io);
  asio::write(c.peer, asio::buffer(std::string_view("hello world")));
  c.start_read(5);
  CHECK(c.run(io).bytes == "hello");
  c.start_read(64);
  CHECK(c.run(io).bytes == " world");
  // Nothing is left: the next read completes when the peer writes again, with what it wrote.
  c.start_read(64);
  asio::write(c.peer, asio::buffer(std::string_view("again")));
  CHECK(c.run(io).bytes == "again");
}
