#pragma once
// Private to the session: a request's admission by its tenant's requests_per_second and tokens_per_minute.
// With --shared-state they are buckets every replica takes from, in the shared ledger, so that they hold over
// all replicas together: one step in Redis takes from both or from neither. When the ledger is down or does
// not answer in time, each replica limits by its own buckets (as without --shared-state). A request larger
// than the whole token budget is refused here, before any bucket is asked.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dplb/balancer/replica_ledger.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/support/io_types.hpp"
#include "dplb/tenants/tenant_book.hpp"
#include "dplb/tenants/token_bucket.hpp"
#include "ledger_wait.hpp"
#include "tenant_pass.hpp"

namespace dplb::server {

// A tenant's shared bucket, by the tenant's name and what it limits.
inline balancer::replica_ledger::bucket_spec shared_bucket(const std::string& tenant, std::string_view limit,
                                                           const tenants::tenant_state::bucket_terms& terms) {
  return {.name = "tenant:" + tenant + ":" + std::string(limit), .rate = terms.rate, .burst = terms.burst};
}

inline io::task<tenants::verdict> admit_by_tenant_limits(const io::executor& executor, shared_state& shared,
                                                         tenant_pass& pass, std::uint64_t tokens) {
  if (!pass || !pass.tenant().limited() || shared.ledger == nullptr || !shared.ledger->up()) {
    co_return pass.admit(tokens);
  }
  auto& tenant = pass.tenant();
  if (auto too_large = tenant.judge_size(tokens); !too_large.admitted()) co_return too_large;
  const auto limits = tenant.limits_to_share();
  std::vector<balancer::replica_ledger::bucket_take> takes;
  std::vector<tenants::verdict::refusal> refusal_of;  // by the takes' order
  if (limits.requests) {
    takes.push_back({shared_bucket(tenant.name(), "requests", *limits.requests), 1});
    refusal_of.push_back(tenants::verdict::refusal::request_rate);
  }
  // The shared budget, even for a request that reserves nothing: what it uses is charged there.
  std::optional<balancer::replica_ledger::bucket_spec> budget;
  if (limits.tokens) budget = shared_bucket(tenant.name(), "tokens", *limits.tokens);
  if (budget && tokens > 0) {
    takes.push_back({*budget, tokens});
    refusal_of.push_back(tenants::verdict::refusal::token_budget);
  }
  if (takes.empty()) co_return pass.admit(tokens);
  auto& ledger = *shared.ledger;
  // A take answered after the session stopped waiting admitted nobody: its units go back. (One Redis ran but
  // whose answer never came within the timeout stays taken until the bucket refills: the request was
  // admitted by this replica's own buckets meanwhile.)
  const auto give_back_unused = [&ledger, given = takes](ledger::bucket_answer&& late) {
    if (!late.ok || !late.taken) return;
    for (const auto& t : given) ledger.give_back(t.bucket, t.units);
  };
  auto answer = co_await await_ledger<ledger::bucket_answer>(
      executor, ledger_patience(shared.settings),
      [&](std::function<void(ledger::bucket_answer)> reply) {
        ledger.take(std::move(takes), [reply = std::move(reply)](const ledger::bucket_answer& a) { reply(a); });
      },
      give_back_unused);
  if (!answer || !answer->ok) co_return pass.admit(tokens);  // the ledger is away: this replica's own buckets
  if (answer->taken) {
    pass.admitted_by_ledger(tokens, ledger, std::move(budget));
    co_return tenants::verdict{};
  }
  tenants::verdict refused{.why = refusal_of.at(answer->refused)};
  // A wait the ledger could not name (units beyond a burst) does not happen after judge_size; 1 s is safe.
  refused.retry_after_seconds =
      answer->retry_after ? tenants::retry_after_seconds(*answer->retry_after) : std::int64_t{1};
  co_return refused;
}

}  // namespace dplb::server
