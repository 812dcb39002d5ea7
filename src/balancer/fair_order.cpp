#include "dplb/balancer/fair_order.hpp"

#include <algorithm>

namespace dplb::balancer {

fair_tag fair_order::enqueue(std::int64_t priority, std::uint64_t tenant, std::uint32_t weight, std::uint64_t cost) {
  auto& b = bands_[priority];
  auto& last = b.last_finish[tenant];  // 0 for a tenant new to the band: the virtual time is at least that
  fair_tag tag{priority, tenant, std::max(b.virtual_time, last), 0};
  tag.finish = tag.start + static_cast<double>(std::max<std::uint64_t>(cost, 1)) / std::max<std::uint32_t>(weight, 1);
  last = tag.finish;
  ++b.waiters;
  ++waiters_of_[tenant];
  return tag;
}

void fair_order::served(const fair_tag& tag) {
  const auto it = bands_.find(tag.priority);
  if (it == bands_.end()) return;
  it->second.virtual_time = std::max(it->second.virtual_time, tag.start);
  leave(tag, it->second);
}

void fair_order::abandoned(const fair_tag& tag) {
  const auto it = bands_.find(tag.priority);
  if (it == bands_.end()) return;
  // Equal only if it was the last of its tenant tagged: the value is stored, never recomputed.
  if (const auto last = it->second.last_finish.find(tag.tenant);
      last != it->second.last_finish.end() && last->second == tag.finish) {
    last->second = tag.start;
  }
  leave(tag, it->second);
}

void fair_order::leave(const fair_tag& tag, band& b) {
  if (--b.waiters == 0) bands_.erase(tag.priority);
  if (const auto it = waiters_of_.find(tag.tenant); it != waiters_of_.end() && --it->second == 0) waiters_of_.erase(it);
}

void fair_order::clear() {
  bands_.clear();
  waiters_of_.clear();
}

std::size_t fair_order::waiting_of(std::uint64_t tenant) const {
  const auto it = waiters_of_.find(tenant);
  return it == waiters_of_.end() ? 0 : it->second;
}

}  // namespace dplb::balancer
