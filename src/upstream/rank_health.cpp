#include "dplb/upstream/rank_health.hpp"

#include <algorithm>

namespace dplb::upstream {

void rank_health::probe_succeeded() {
  probe_failures_ = 0;
  if (healthy_) return;
  if (++probe_successes_ >= policy_.healthy_threshold) {
    healthy_ = true;
    probe_successes_ = 0;
  }
}

void rank_health::probe_failed() {
  probe_successes_ = 0;
  if (!healthy_) return;
  if (++probe_failures_ >= policy_.unhealthy_threshold) {
    healthy_ = false;
    probe_failures_ = 0;
  }
}

bool rank_health::record(request_outcome outcome, time_point now, bool may_eject) {
  if (outcome == request_outcome::success) {
    consecutive_errors_ = 0;
    return false;
  }
  if (policy_.ejection_threshold == 0 || ejected()) return false;
  if (++consecutive_errors_ < policy_.ejection_threshold) return false;
  if (!may_eject) return false;  // stays at the threshold: the next failure tries again
  // A rank that stayed clean for a whole maximum back-off since its last ejection starts afresh.
  if (ejections_ > 0 && now - last_ejection_end_ >= policy_.max_ejection) ejections_ = 0;
  const auto factor = std::min<std::uint32_t>(ejections_, 16);
  const auto duration =
      std::min<std::chrono::milliseconds>(policy_.base_ejection * (1LL << factor), policy_.max_ejection);
  ejected_until_ = now + duration;
  ++ejections_;
  consecutive_errors_ = 0;
  return true;
}

void rank_health::tick(time_point now) {
  if (ejected_until_ && now >= *ejected_until_) {
    last_ejection_end_ = *ejected_until_;
    ejected_until_.reset();
  }
}

}  // namespace dplb::upstream
