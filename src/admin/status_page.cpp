#include "dplb/admin/status_page.hpp"

namespace dplb::admin {

const static_asset* status_page_asset(std::string_view path) noexcept {
  for (const auto& asset : status_page_assets()) {
    if (asset.path == path) return &asset;
  }
  return nullptr;
}

}  // namespace dplb::admin
