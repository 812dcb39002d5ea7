// The simulated engine's --start-after, which bench/imbalance.sh relies on for a burst's t=0: no step
// may run before the last request of the burst arrives, and then every request runs.

#include <catch2/catch.hpp>

#include <memory>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"

using namespace dplb::test;
using namespace std::chrono_literals;

TEST_CASE("the simulated engine holds its steps until --start-after requests have arrived", "[mock]") {
  mock_engine engine(2, {"--simulate", "--dp-lockstep", "--time-scale", "100", "--start-after", "3"});
  const auto steps = [&] { return metric_sum(engine.metrics(0), "mock_steps_total"); };
  const auto received = [&] {
    return metric_sum(engine.metrics(0), "mock_requests_received_total") +
           metric_sum(engine.metrics(1), "mock_requests_received_total");
  };
  const std::string body = R"({"prompt":"a b","max_tokens":4})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              "Content-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<std::unique_ptr<http_connection>> clients;
  for (const std::size_t rank : {0, 1}) {
    clients.push_back(std::make_unique<http_connection>(engine.ports()[rank]));
    clients.back()->write_raw(request);
  }
  REQUIRE(await_until(received, [](double n) { return n == 2; }) == 2);
  // Unheld, the first step would begin within a turn of the event loop: give it ample time to (wrongly) run.
  CHECK(await_until(steps, [](double n) { return n > 0; }, 300ms) == 0);

  clients.push_back(std::make_unique<http_connection>(engine.ports()[0]));
  clients.back()->write_raw(request);
  for (auto& client : clients) {
    const auto answer = client->read_until_close(5s);
    CHECK(answer.find("HTTP/1.1 200 OK") == 0);
    CHECK(answer.find("\"completion_tokens\":4") != std::string::npos);
  }
  CHECK(steps() >= 4);  // 4 tokens each, all started together: prefill + decodes
}
