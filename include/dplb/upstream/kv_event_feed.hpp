#pragma once
// Keeps the KV-cache event subscriber reading from exactly the ranks that publish now: the ranks of every
// backend with #kv-events= that is not removed (rank j of a backend on its publisher's port + j, vLLM's
// rule), and drops the index of a rank that turns unhealthy (its engine may be gone or restarting with an
// empty cache; its events, if it still sends them, rebuild the index). Backends come and go at run time
// (the admin API, SIGHUP), so the feed is refreshed periodically rather than told of each change.
//
// Threading contract: one thread calls refresh() (the main thread's loop); what it reads (topology,
// balancer flags) and what it changes (subscriber, index) are thread-safe.

#include <cstdint>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/kv/event_index.hpp"
#include "dplb/kv/event_subscriber.hpp"
#include "dplb/upstream/backend.hpp"

namespace dplb::upstream {

// The event sources of the ranks as they stand: every rank of a backend with #kv-events= that is not removed.
std::vector<kv::event_source> kv_event_sources(const topology& topology, const balancer::balancer& balancer);

class kv_event_feed {
 public:
  kv_event_feed(const topology& topology, const balancer::balancer& balancer, kv::event_index& index,
                kv::event_subscriber& subscriber)
      : topology_(topology), balancer_(balancer), index_(index), subscriber_(subscriber) {}

  void refresh();

 private:
  const topology& topology_;
  const balancer::balancer& balancer_;
  kv::event_index& index_;
  kv::event_subscriber& subscriber_;
  std::vector<bool> unhealthy_;  // as of the last refresh
};

}  // namespace dplb::upstream
