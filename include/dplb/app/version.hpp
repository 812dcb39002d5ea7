#pragma once
#include <string_view>

namespace dplb::app {
std::string_view version() noexcept;
}
