#pragma once
// Reading a whole file the configuration names (the config file, the admin token's file).

#include <string>
#include <string_view>

namespace dplb::config::detail {

// The file's bytes. Throws config_error "cannot read <what> '<path>': <reason>" (a directory included).
std::string read_text_file(const std::string& path, std::string_view what);

// `s` without leading and trailing whitespace.
std::string_view trim_whitespace(std::string_view s);

}  // namespace dplb::config::detail
