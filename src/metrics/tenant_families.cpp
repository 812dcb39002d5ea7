// The tenants' metric families, read from each tenant's own counters at scrape time (tenant_state keeps them
// as atomics: nothing on the request path touches prometheus-cpp). One series per tenant ever configured:
// the label values are the configuration's names, never what a client sent.
#include <string>

#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/tenants/tenant_book.hpp"
#include "scraped_families.hpp"

namespace dplb::metrics {

std::vector<prometheus::MetricFamily> tenant_families(const tenants::tenant_book& book) {
  auto requests = scraped_family("dplb_tenant_requests_total",
                                 "Requests of the tenant answered, by the HTTP status the client got (429: over "
                                 "a limit; 401: no known API key; 499: the client left)",
                                 prometheus::MetricType::Counter);
  auto queued = scraped_family("dplb_tenant_queued", "The tenant's requests waiting in dplb's queue now",
                               prometheus::MetricType::Gauge);
  auto in_flight = scraped_family("dplb_tenant_in_flight", "The tenant's requests holding a rank's slot now",
                                  prometheus::MetricType::Gauge);
  auto tokens = scraped_family("dplb_tenant_tokens_total",
                               "Tokens the engines reported in the usage of the tenant's responses, by kind "
                               "(prompt, completion)",
                               prometheus::MetricType::Counter);
  const auto sample = [](std::vector<prometheus::ClientMetric::Label> labels) {
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    return m;
  };
  const auto now = tenants::tenant_state::clock::now();
  for (const auto& tenant : book.every_tenant()) {
    const auto s = tenant->read(now);
    for (const auto& [status, count] : s.requests_by_status) {
      auto m = sample({{"tenant", s.name}, {"code", std::to_string(status)}});
      m.counter.value = static_cast<double>(count);
      requests.metric.push_back(std::move(m));
    }
    auto q = sample({{"tenant", s.name}});
    q.gauge.value = static_cast<double>(s.queued);
    queued.metric.push_back(std::move(q));
    auto f = sample({{"tenant", s.name}});
    f.gauge.value = static_cast<double>(s.in_flight);
    in_flight.metric.push_back(std::move(f));
    auto p = sample({{"tenant", s.name}, {"kind", "prompt"}});
    p.counter.value = static_cast<double>(s.prompt_tokens);
    tokens.metric.push_back(std::move(p));
    auto c = sample({{"tenant", s.name}, {"kind", "completion"}});
    c.counter.value = static_cast<double>(s.completion_tokens);
    tokens.metric.push_back(std::move(c));
  }
  std::vector<prometheus::MetricFamily> out;
  out.push_back(std::move(requests));
  out.push_back(std::move(queued));
  out.push_back(std::move(in_flight));
  out.push_back(std::move(tokens));
  return out;
}

}  // namespace dplb::metrics
