#pragma once
// The shared ledger's Redis Function library (dplb_pick, dplb_release, dplb_register, dplb_view,
// dplb_bucket), loaded
// by every replica on every (re)connect with FUNCTION LOAD REPLACE, so that a fresh empty server works.

#include <string_view>

namespace dplb::ledger {

extern const std::string_view ledger_function_library;

}  // namespace dplb::ledger
