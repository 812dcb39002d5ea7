// The tenants' metric families as a scrape shows them: one series per tenant ever configured (a tenant a
// reload dropped keeps its series), counts by status as they happened, gauges and tokens; and the queue wait
// by priority band, three series whatever priorities come.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/round_robin.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/tenants/tenant_book.hpp"

using namespace dplb;
using Catch::Matchers::Contains;

namespace {

tenants::tenant_spec named(std::string name) {
  tenants::tenant_spec spec;
  spec.name = std::move(name);
  return spec;
}

}  // namespace

TEST_CASE("tenant metrics: each configured tenant's requests by status, queued, in flight and tokens", "[metrics][tenants]") {
  balancer::balancer b(1, std::make_unique<balancer::round_robin>());
  metrics::proxy_metrics m({"http://127.0.0.1:1"}, b, "round-robin");
  const std::vector<tenants::tenant_spec> specs{named("batch"), named("chat")};
  tenants::tenant_book book(specs);
  m.observe_tenants(book);
  auto batch = book.identify("", "batch").tenant;
  batch->count_status(200);
  batch->count_status(429);
  batch->count_status(429);
  batch->add_queued(2);
  batch->add_in_flight(1);
  batch->count_tokens(30, 7);
  const auto text = m.render();
  CHECK_THAT(text, Contains("dplb_tenant_requests_total{tenant=\"batch\",code=\"200\"} 1"));
  CHECK_THAT(text, Contains("dplb_tenant_requests_total{tenant=\"batch\",code=\"429\"} 2"));
  CHECK_THAT(text, Contains("dplb_tenant_queued{tenant=\"batch\"} 2"));
  CHECK_THAT(text, Contains("dplb_tenant_in_flight{tenant=\"batch\"} 1"));
  CHECK_THAT(text, Contains("dplb_tenant_tokens_total{tenant=\"batch\",kind=\"prompt\"} 30"));
  CHECK_THAT(text, Contains("dplb_tenant_tokens_total{tenant=\"batch\",kind=\"completion\"} 7"));
  CHECK_THAT(text, Contains("dplb_tenant_queued{tenant=\"chat\"} 0"));
  CHECK_THAT(text, Contains("dplb_tenant_queued{tenant=\"default\"} 0"));
  // A tenant a reload drops keeps its series: its counters must not go back to nothing.
  const std::vector<tenants::tenant_spec> fewer{named("chat")};
  book.reload(fewer);
  CHECK_THAT(m.render(), Contains("dplb_tenant_requests_total{tenant=\"batch\",code=\"429\"} 2"));
}

TEST_CASE("tenant metrics: the queue wait by priority band, high below 0, normal at 0, low above", "[metrics]") {
  balancer::balancer b(1, std::make_unique<balancer::round_robin>());
  metrics::proxy_metrics m({"http://127.0.0.1:1"}, b, "round-robin");
  m.queued(std::chrono::milliseconds(5), -7);
  m.queued(std::chrono::milliseconds(5), 0);
  m.queued(std::chrono::milliseconds(5), 0);
  m.queued(std::chrono::milliseconds(5), 1000);
  const auto text = m.render();
  CHECK_THAT(text, Contains("dplb_queue_wait_by_priority_seconds_count{band=\"high\"} 1"));
  CHECK_THAT(text, Contains("dplb_queue_wait_by_priority_seconds_count{band=\"normal\"} 2"));
  CHECK_THAT(text, Contains("dplb_queue_wait_by_priority_seconds_count{band=\"low\"} 1"));
  CHECK_THAT(text, Contains("dplb_queue_wait_seconds_count 4"));
}
