#include "dplb/app/version.hpp"

namespace dplb::app {
std::string_view version() noexcept { return DPLB_VERSION; }
}  // namespace dplb::app
