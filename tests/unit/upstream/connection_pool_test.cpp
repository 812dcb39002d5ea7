#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include <vector>

#include "dplb/upstream/connection_pool.hpp"

namespace asio = boost::asio;
using namespace dplb;

namespace {

// An engine that accepts on loopback, and one connection to it as the pool holds them.
struct engine_side {
  explicit engine_side(asio::io_context& io) : acceptor(io, {asio::ip::make_address("127.0.0.1"), 0}) {
    upstream::backend b;
    b.url = "http://127.0.0.1:" + std::to_string(acceptor.local_endpoint().port());
    b.endpoints.push_back(acceptor.local_endpoint());
    topology.add(std::move(b), 1);
  }

  // A connected engine connection, its engine end kept in `peers`.
  upstream::connection_ptr connect(asio::io_context& io) {
    auto c = std::make_unique<upstream::upstream_connection>(io.get_executor());
    c->stream.socket().connect(acceptor.local_endpoint());
    peers.emplace_back(io);
    acceptor.accept(peers.back());
    return c;
  }

  asio::ip::tcp::acceptor acceptor;
  upstream::topology topology{4};
  std::vector<asio::ip::tcp::socket> peers;
};

}  // namespace

TEST_CASE("the pool hands out a clean idle connection, never one the engine wrote to or closed",
          "[upstream][pool]") {
  asio::io_context io;
  engine_side engine(io);
  engine.peers.reserve(3);
  upstream::connection_pool pool(io.get_executor(), engine.topology, upstream::pool_limits{});

  // The checks happen when a connection is taken, with no event loop run in between: a byte or a close
  // that arrived while it waited must be seen then, not when some completion gets to run.
  SECTION("clean: handed out, and marked as reused") {
    pool.give_back(0, engine.connect(io));
    auto c = pool.take_idle(0);
    REQUIRE(c);
    CHECK(c->reused);
    CHECK(pool.take_idle(0) == nullptr);  // taken once only
  }
  SECTION("stray bytes from the engine: closed, not handed out") {
    pool.give_back(0, engine.connect(io));
    asio::write(engine.peers.back(), asio::buffer("HTTP/1.1 200 OK\r\n", 17));
    CHECK(pool.take_idle(0) == nullptr);
    CHECK(pool.idle_count(0) == 0);
  }
  SECTION("closed by the engine: closed, not handed out") {
    pool.give_back(0, engine.connect(io));
    engine.peers.back().close();
    CHECK(pool.take_idle(0) == nullptr);
  }
  SECTION("a dirty one is skipped for the next clean one") {
    pool.give_back(0, engine.connect(io));  // older, clean
    pool.give_back(0, engine.connect(io));  // newest, the engine closes it
    engine.peers.back().close();
    auto c = pool.take_idle(0);
    REQUIRE(c);
    CHECK(c->stream.socket().is_open());
    CHECK(pool.idle_count(0) == 0);
  }
}
