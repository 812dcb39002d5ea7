// dplb's memory bounds (docs/operations.md, "Memory"), seen from outside: an idle keep-alive connection
// holds at most 16 KiB, however large the request it carried, and a connection that gave its memory back
// serves its next request as any other.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "await.hpp"
#include "http_client.hpp"
#include "processes.hpp"
#include "timing_slack.hpp"

using namespace dplb::test;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// A sanitizer's allocator keeps freed memory in quarantine and adds shadow memory: RSS says nothing
// about dplb's own bounds there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool rss_is_dplbs = false;
#else
constexpr bool rss_is_dplbs = true;
#endif

bhttp::request<bhttp::string_body> completion_with_prompt(std::size_t prompt_bytes) {
  json body{{"model", "mock-model"}, {"prompt", std::string(prompt_bytes, 'x')}, {"max_tokens", 1}};
  bhttp::request<bhttp::string_body> r{bhttp::verb::post, "/v1/completions", 11};
  r.set(bhttp::field::content_type, "application/json");
  r.body() = body.dump();
  return r;
}

}  // namespace

TEST_CASE("idle keep-alive connections give back what a large request body took", "[memory]") {
  // A long-context request's usual size: before the bound, each such connection kept its body's storage
  // (up to 1 MiB) and a 16 KiB read buffer for the rest of its life: 529 KiB each.
  constexpr std::size_t connections = rss_is_dplbs ? 300 : 30;  // under a sanitizer: the reuse alone, sooner
  constexpr std::size_t prompt_bytes = 500'000;
  constexpr long bound_kib = 16;
  mock_engine engine(1);
  dplb_proxy proxy(engine.urls(), {"--threads", "1"});
  {
    http_connection warm_up(proxy.port());  // what the first requests allocate once is not a connection's
    for (int i = 0; i < 3; ++i) REQUIRE(warm_up.send(completion_with_prompt(prompt_bytes)).status == 200);
  }
  const long before = proxy.process().rss_kib();

  std::vector<std::unique_ptr<http_connection>> clients;
  for (std::size_t i = 0; i < connections; ++i) {
    clients.push_back(std::make_unique<http_connection>(proxy.port()));
    const auto response = clients.back()->send(completion_with_prompt(prompt_bytes));
    REQUIRE(response.status == 200);
    REQUIRE(response.keep_alive);
  }
  // Every connection is idle now, kept alive. Within moments each gives back its buffers.
  const long held = await_until([&] { return proxy.process().rss_kib(); },
                                [&](long rss) { return !rss_is_dplbs || rss - before <= long{connections} * bound_kib; },
                                std::chrono::milliseconds(static_cast<long>(5000 * timing_slack())));
  INFO("RSS " << before << " KiB before, " << held << " KiB with " << connections << " idle connections: "
              << double(held - before) / connections << " KiB each");
  if (rss_is_dplbs) CHECK(held - before <= long{connections} * bound_kib);

  // A connection that gave its memory back reads its next request as before, large or small.
  for (std::size_t i = 0; i < connections; i += 30) {
    CHECK(clients[i]->send(completion_with_prompt(i % 60 == 0 ? prompt_bytes : 10)).status == 200);
  }
  CHECK(metric_sum(scrape_metrics(proxy.port()), "dplb_requests_total{") == connections + 3 + connections / 30);
}
