// The tenants as dplb runs them: a request's tenant by key, then header, then default; each tenant's request
// rate and token budget, refused without taking anything and corrected by the usage; counts by status; and
// reloads that keep each tenant's state by name and change nothing when refused.
#include <catch2/catch.hpp>

#include <chrono>
#include <stdexcept>
#include <vector>

#include "dplb/tenants/tenant_book.hpp"

using namespace dplb::tenants;
using namespace std::chrono_literals;

namespace {

const tenant_state::clock::time_point t0 = tenant_state::clock::time_point{} + 1000s;

tenant_spec team(std::string name, std::vector<std::string> keys = {}) {
  tenant_spec spec;
  spec.name = std::move(name);
  spec.api_keys = std::move(keys);
  return spec;
}

}  // namespace

TEST_CASE("tenant book: a known key decides, else a header naming a keyless tenant, else default", "[tenants]") {
  const std::vector<tenant_spec> specs{team("batch", {"key-b"}), team("chat", {"key-c"}), team("research")};
  const tenant_book book(specs);
  CHECK(book.identify("Bearer key-b", "").tenant->name() == "batch");
  CHECK(book.identify("Bearer key-b", "").known_key);
  CHECK(book.identify("Bearer key-c", "batch").tenant->name() == "chat");  // the key wins over the header
  const auto by_header = book.identify("", "research");
  CHECK(by_header.tenant->name() == "research");
  CHECK_FALSE(by_header.known_key);
  // A tenant with keys is its keys' only: its name in the header without one counts as default.
  const auto keyless = book.identify("", "batch");
  CHECK(keyless.tenant->name() == "default");
  CHECK_FALSE(keyless.known_key);
  CHECK(book.identify("Bearer unknown", "chat").tenant->name() == "default");
  CHECK(book.identify("Bearer unknown", "nobody").tenant->name() == "default");
  CHECK(book.identify("", "").tenant->id() == 0);
  CHECK_FALSE(book.identify("Bearer unknown", "").known_key);
}

TEST_CASE("tenant book: a request rate refuses with the wait in whole seconds, and other tenants go on", "[tenants]") {
  auto limited = team("batch", {"key-b"});
  limited.requests_per_second = 0.5;  // burst: 1
  const std::vector<tenant_spec> specs{limited, team("chat", {"key-c"})};
  tenant_book book(specs);
  auto batch = book.identify("Bearer key-b", "").tenant;
  auto chat = book.identify("Bearer key-c", "").tenant;
  CHECK(batch->admit(t0, 0).admitted());
  const auto refused = batch->admit(t0 + 100ms, 0);
  CHECK(refused.why == verdict::refusal::request_rate);
  CHECK(refused.retry_after_seconds == 2);  // 1.9 s to the next unit, rounded up
  for (int i = 0; i < 50; ++i) CHECK(chat->admit(t0, 0).admitted());
  CHECK(batch->admit(t0 + 2s, 0).admitted());
}

TEST_CASE("tenant book: a token budget reserves, refuses what it cannot hold, and is corrected by the usage",
          "[tenants]") {
  auto spec = team("batch");
  spec.tokens_per_minute = 600;  // 10 a second, 600 deep
  spec.requests_per_second = 100;
  const std::vector<tenant_spec> specs{spec};
  tenant_book book(specs);
  auto batch = book.identify("", "batch").tenant;
  REQUIRE(batch->admit(t0, 500).admitted());
  const auto over = batch->admit(t0, 200);
  CHECK(over.why == verdict::refusal::token_budget);
  CHECK(over.retry_after_seconds == 10);  // 100 tokens missing at 10 a second
  // The engine used 100 of the 500 reserved: 400 come back, and the 200 fit.
  batch->settle(t0, 500, 100);
  CHECK(batch->admit(t0, 200).admitted());
  // A request larger than the whole budget never fits: it is told so, not to wait.
  const auto never = batch->admit(t0, 601);
  CHECK(never.why == verdict::refusal::larger_than_budget);
  CHECK(never.retry_after_seconds == 0);  // no wait helps: no Retry-After
  CHECK(never.tokens == 601);
  CHECK(never.budget == 600);
  // Usage beyond the reservation is charged.
  batch->settle(t0, 10, 400);  // 300 were left: 90 in debt now
  CHECK(batch->admit(t0, 1).why == verdict::refusal::token_budget);
}

TEST_CASE("tenant book: a refusal by the token budget takes nothing from the request rate", "[tenants]") {
  auto spec = team("batch");
  spec.requests_per_second = 1;  // burst 1
  spec.tokens_per_minute = 60;
  const std::vector<tenant_spec> specs{spec};
  tenant_book book(specs);
  auto batch = book.identify("", "batch").tenant;
  CHECK(batch->admit(t0, 100).why == verdict::refusal::larger_than_budget);
  CHECK(batch->admit(t0, 10).admitted());  // the request rate's one unit was still there
  CHECK(batch->admit(t0, 10).why == verdict::refusal::request_rate);
}

TEST_CASE("tenant book: statuses, tokens, queued and in flight are counted per tenant", "[tenants]") {
  const std::vector<tenant_spec> specs{team("batch")};
  tenant_book book(specs);
  auto batch = book.identify("", "batch").tenant;
  batch->count_status(200);
  batch->count_status(200);
  batch->count_status(429);
  batch->count_tokens(10, 5);
  batch->add_queued(2);
  batch->add_queued(-1);
  batch->add_in_flight(3);
  const auto s = batch->read(t0);
  CHECK(s.name == "batch");
  CHECK(s.requests_by_status == std::vector<std::pair<unsigned, std::uint64_t>>{{200, 2}, {429, 1}});
  CHECK(s.prompt_tokens == 10);
  CHECK(s.completion_tokens == 5);
  CHECK(s.queued == 1);
  CHECK(s.in_flight == 3);
  CHECK(book.identify("", "").tenant->read(t0).requests_by_status.empty());
}

TEST_CASE("tenant book: the request rate shown is the admitted requests over the last ten seconds", "[tenants]") {
  const std::vector<tenant_spec> specs{team("batch")};
  tenant_book book(specs);
  auto batch = book.identify("", "batch").tenant;
  for (int i = 0; i < 20; ++i) REQUIRE(batch->admit(t0, 0).admitted());
  for (int i = 0; i < 10; ++i) REQUIRE(batch->admit(t0 + 5s, 0).admitted());
  CHECK(batch->read(t0 + 5s).requests_per_second == Approx(3.0));
  CHECK(batch->read(t0 + 9s).requests_per_second == Approx(3.0));
  CHECK(batch->read(t0 + 10s).requests_per_second == Approx(1.0));  // the first second left the window
  CHECK(batch->read(t0 + 15s).requests_per_second == Approx(0.0));
  REQUIRE(batch->admit(t0 + 30s, 0).admitted());
  CHECK(batch->read(t0 + 30s).requests_per_second == Approx(0.1));
}

TEST_CASE("tenant book: a reload keeps each tenant's state by name and changes nothing when refused", "[tenants]") {
  auto limited = team("batch", {"key-b"});
  limited.requests_per_second = 1;
  const std::vector<tenant_spec> first{limited, team("chat")};
  tenant_book book(first);
  auto batch = book.identify("Bearer key-b", "").tenant;
  batch->add_queued(1);
  REQUIRE(batch->admit(t0, 0).admitted());  // its one unit taken

  auto renamed_key = team("batch", {"key-new"});
  renamed_key.requests_per_second = 1;
  renamed_key.weight = 3;
  const std::vector<tenant_spec> second{renamed_key, team("research")};
  book.reload(second);
  auto again = book.identify("Bearer key-new", "").tenant;
  CHECK(again == batch);  // the same state: its queued request still counted
  CHECK(again->read(t0).queued == 1);
  CHECK(again->current_limits().weight == 3);
  CHECK(again->admit(t0, 0).why == verdict::refusal::request_rate);  // a reload grants no new burst
  CHECK(book.identify("Bearer key-b", "").tenant->name() == "default");  // the old key is gone
  CHECK(book.identify("", "chat").tenant->name() == "default");
  CHECK(book.tenants().size() == 3);        // default, batch, research
  CHECK(book.every_tenant().size() == 4);   // chat's series stay
  const auto research_id = book.identify("", "research").tenant->id();
  CHECK(research_id != batch->id());

  const std::vector<tenant_spec> broken{team("batch"), team("batch")};
  CHECK_THROWS_AS(book.reload(broken), std::invalid_argument);
  CHECK(book.identify("", "research").tenant->id() == research_id);
  CHECK(book.identify("Bearer key-new", "").tenant == batch);
}

TEST_CASE("tenant book: a raised limit starts as full as the old one stood", "[tenants]") {
  auto spec = team("batch");
  spec.requests_per_second = 1;
  spec.burst = 2;
  const std::vector<tenant_spec> first{spec};
  tenant_book book(first);
  auto batch = book.identify("", "batch").tenant;
  REQUIRE(batch->admit(t0, 0).admitted());
  REQUIRE(batch->admit(t0, 0).admitted());
  spec.burst = 4;
  const std::vector<tenant_spec> second{spec};
  book.reload(second, t0);
  // The old bucket was empty (2 missing); the new one, 4 deep, misses 2 too: 2 requests pass, not 4.
  CHECK(batch->admit(t0, 0).admitted());
  CHECK(batch->admit(t0, 0).admitted());
  CHECK_FALSE(batch->admit(t0, 0).admitted());
}

TEST_CASE("tenant book: min_priority raises a request's priority to it, and a reload changes it", "[tenants]") {
  auto batch_spec = team("batch");
  batch_spec.min_priority = 5;
  auto chat_spec = team("chat");
  chat_spec.min_priority = -2;
  const std::vector<tenant_spec> first{batch_spec, chat_spec, team("research")};
  tenant_book book(first);
  auto batch = book.identify("", "batch").tenant;
  auto chat = book.identify("", "chat").tenant;
  auto research = book.identify("", "research").tenant;
  CHECK(batch->has_min_priority());
  CHECK(batch->min_priority() == 5);
  CHECK(batch->allowed_priority(-100) == 5);
  CHECK(batch->allowed_priority(0) == 5);  // none asked is 0, raised too
  CHECK(batch->allowed_priority(9) == 9);
  CHECK(chat->allowed_priority(-100) == -2);
  CHECK(chat->allowed_priority(0) == 0);
  CHECK_FALSE(research->has_min_priority());
  CHECK(research->allowed_priority(-100) == -100);
  CHECK(batch->current_limits().min_priority == 5);

  batch_spec.min_priority.reset();
  const std::vector<tenant_spec> second{batch_spec};
  book.reload(second);
  CHECK_FALSE(batch->has_min_priority());
  CHECK(batch->allowed_priority(-100) == -100);
}

TEST_CASE("tenant book: a request without max_tokens reserves the rest of the context, at most the whole budget",
          "[tenants]") {
  auto spec = team("batch");
  spec.tokens_per_minute = 6000;  // 6000 deep
  const std::vector<tenant_spec> specs{spec, team("chat")};
  tenant_book book(specs);
  auto batch = book.identify("", "batch").tenant;
  auto chat = book.identify("", "chat").tenant;
  CHECK(batch->unbounded_reservation(100, 2000) == 2100);  // fits: all of it
  CHECK(batch->unbounded_reservation(100, 8092) == 6000);  // more than the budget holds: the budget
  CHECK(batch->unbounded_reservation(7000, 1192) == 7000);  // the prompt alone is over: too large, by its prompt
  CHECK(batch->admit(t0, batch->unbounded_reservation(7000, 1192)).why == verdict::refusal::larger_than_budget);
  const auto whole = batch->unbounded_reservation(2, 8190);
  CHECK(batch->admit(t0, whole).admitted());
  CHECK(batch->admit(t0, 1).why == verdict::refusal::token_budget);
  // It streamed 300 tokens: the rest comes back.
  batch->settle(t0, whole, 302);
  CHECK(batch->admit(t0, 5698).admitted());
  CHECK(chat->unbounded_reservation(100, 8092) == 8192);  // no budget: nothing to bound it by
}
