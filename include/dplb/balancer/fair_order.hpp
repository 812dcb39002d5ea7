#pragma once
// The order of one cluster's queue (queue_lines.hpp): the lowest priority value first; among equal
// priorities, tenants share the freed slots in proportion to their weights (start-time fair queueing, SFQ:
// Goyal, Vin and Cheng, 1996); one tenant's requests in their order of arrival.
//
// Each priority value is a band with its own virtual time. A waiter's tenant, weight and cost give it a start
// tag, where its tenant's previous waiter in the band finished (or the band's virtual time, if that is later:
// a tenant that was idle gets no credit for it), and a finish tag, its start plus its cost over its weight.
// Waiters go by start tag; serving one moves the band's virtual time up to its start. So a tenant of weight 3
// has three requests of cost 1 start in each unit of virtual time where a tenant of weight 1 has one, and a
// tenant arriving late starts at the virtual time, ahead of another's backlog.
//
// Not thread-safe: the balancer calls it under its lock. Its state is bounded by the waiters: a band with no
// waiter left is forgotten, and with it its tenants' tags.

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

namespace dplb::balancer {

// A waiter's tags, as fair_order handed them out; it takes them back when the waiter leaves.
struct fair_tag {
  std::int64_t priority = 0;
  std::uint64_t tenant = 0;
  double start = 0;   // the band's virtual time at which the waiter's turn comes
  double finish = 0;  // start + cost / weight: where its tenant's next waiter in the band starts
};

// Whether the waiter tagged `a` (queued as number `a_id`) goes before the one tagged `b`: the lower priority
// value, then the earlier start, then the earlier arrival (ids rise). A strict weak order, and a total one
// over distinct ids.
inline bool goes_before(const fair_tag& a, std::uint64_t a_id, const fair_tag& b, std::uint64_t b_id) noexcept {
  return std::tie(a.priority, a.start, a_id) < std::tie(b.priority, b.start, b_id);
}

class fair_order {
 public:
  // Tags a new waiter. A weight or a cost of 0 is taken as 1.
  fair_tag enqueue(std::int64_t priority, std::uint64_t tenant, std::uint32_t weight, std::uint64_t cost);
  // The waiter got its slot: the band's virtual time reaches its start.
  void served(const fair_tag& tag);
  // The waiter left unserved (it gave up, was turned away): if no later waiter of its tenant was tagged
  // after it, its tenant's next waiter starts where it would have, so a request that was given up costs its
  // tenant nothing.
  void abandoned(const fair_tag& tag);
  // Forgets every waiter (the queue was dropped whole).
  void clear();

  std::size_t waiting_of(std::uint64_t tenant) const;
  std::size_t bands() const noexcept { return bands_.size(); }

 private:
  // Vectors searched in order, not maps: a handful of priorities and tenants is the expected case, where a
  // scan is as fast as a hash and, once warm, allocates nothing under the balancer's lock (a waiter queued
  // and served each round would otherwise allocate and free a band, its tags and its tenant's count).
  struct tenant_tag {
    std::uint64_t tenant = 0;
    double last_finish = 0;
  };
  struct band {
    std::int64_t priority = 0;
    double virtual_time = 0;
    std::vector<tenant_tag> tags;  // a tenant's last finish tag, for each tenant tagged in the band
    std::size_t waiters = 0;
  };
  struct tenant_count {
    std::uint64_t tenant = 0;
    std::size_t waiters = 0;
  };
  band* find_band(std::int64_t priority) noexcept;
  void leave(const fair_tag& tag, band& b);

  std::vector<band> bands_;                // those with waiters, in no order
  std::vector<tenant_tag> spare_tags_;     // a forgotten band's storage, empty, kept for the next band
  std::vector<tenant_count> waiters_of_;  // tenants with waiters, over every band
};

}  // namespace dplb::balancer
