#include "dplb/balancer/fair_order.hpp"

#include <algorithm>
#include <utility>

namespace dplb::balancer {

namespace {

template <typename Entries>
auto find_tenant(Entries& entries, std::uint64_t tenant) noexcept {
  return std::find_if(entries.begin(), entries.end(), [tenant](const auto& e) { return e.tenant == tenant; });
}

// Erases by moving the last entry into its place: the order of the entries means nothing.
template <typename Entries, typename It>
void erase_unordered(Entries& entries, It it) {
  if (it != entries.end() - 1) *it = std::move(entries.back());
  entries.pop_back();
}

}  // namespace

fair_order::band* fair_order::find_band(std::int64_t priority) noexcept {
  const auto it = std::find_if(bands_.begin(), bands_.end(), [priority](const band& b) { return b.priority == priority; });
  return it == bands_.end() ? nullptr : &*it;
}

fair_tag fair_order::enqueue(std::int64_t priority, std::uint64_t tenant, std::uint32_t weight, std::uint64_t cost) {
  band* b = find_band(priority);
  if (!b) {
    b = &bands_.emplace_back(band{priority, 0, std::move(spare_tags_), 0});
    spare_tags_ = {};
  }
  auto last = find_tenant(b->tags, tenant);
  // A tenant new to the band has no finish tag yet: it starts at the virtual time.
  if (last == b->tags.end()) last = b->tags.insert(last, tenant_tag{tenant, b->virtual_time});
  fair_tag tag{priority, tenant, std::max(b->virtual_time, last->last_finish), 0};
  tag.finish = tag.start + static_cast<double>(std::max<std::uint64_t>(cost, 1)) / std::max<std::uint32_t>(weight, 1);
  last->last_finish = tag.finish;
  ++b->waiters;
  if (auto count = find_tenant(waiters_of_, tenant); count != waiters_of_.end()) {
    ++count->waiters;
  } else {
    waiters_of_.push_back(tenant_count{tenant, 1});
  }
  return tag;
}

void fair_order::served(const fair_tag& tag) {
  band* b = find_band(tag.priority);
  if (!b) return;
  b->virtual_time = std::max(b->virtual_time, tag.start);
  leave(tag, *b);
}

void fair_order::abandoned(const fair_tag& tag) {
  band* b = find_band(tag.priority);
  if (!b) return;
  // Equal only if it was the last of its tenant tagged: the value is stored, never recomputed.
  if (const auto last = find_tenant(b->tags, tag.tenant); last != b->tags.end() && last->last_finish == tag.finish) {
    last->last_finish = tag.start;
  }
  leave(tag, *b);
}

void fair_order::leave(const fair_tag& tag, band& b) {
  if (--b.waiters == 0) {
    spare_tags_ = std::move(b.tags);
    spare_tags_.clear();
    erase_unordered(bands_, bands_.begin() + (&b - bands_.data()));
  }
  if (const auto it = find_tenant(waiters_of_, tag.tenant); it != waiters_of_.end() && --it->waiters == 0) {
    erase_unordered(waiters_of_, it);
  }
}

void fair_order::clear() {
  bands_.clear();
  waiters_of_.clear();
}

std::size_t fair_order::waiting_of(std::uint64_t tenant) const {
  const auto it = find_tenant(waiters_of_, tenant);
  return it == waiters_of_.end() ? 0 : it->waiters;
}

}  // namespace dplb::balancer
