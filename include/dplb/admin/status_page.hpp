#pragma once
// The admin listener's status page: a few static files (src/admin/status_page/) compiled into dplb by
// CMake (embed.cmake), so that nothing has to be installed next to the binary or fetched from elsewhere.
// The page reads GET /ranks from the same listener; the admin API serves these files at their paths.

#include <span>
#include <string_view>

namespace dplb::admin {

struct static_asset {
  std::string_view path;          // "/", "/status.js", ...
  std::string_view content_type;  // with its charset
  std::string_view body;
};

// Every file of the page (generated at build time from src/admin/status_page/).
std::span<const static_asset> status_page_assets() noexcept;

// The asset served at `path` (query already removed), or nullptr.
const static_asset* status_page_asset(std::string_view path) noexcept;

// The Content-Security-Policy of the page: nothing but its own script, style and JSON, no inline code at
// all, no framing, no form or <base> target.
inline constexpr std::string_view status_page_csp =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace dplb::admin
