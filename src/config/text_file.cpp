#include "text_file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "dplb/config/settings.hpp"

namespace dplb::config::detail {

std::string read_text_file(const std::string& path, std::string_view what) {
  const std::string cannot = "cannot read " + std::string(what) + " '" + path + "': ";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw config_error(cannot + "it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(cannot + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw config_error(cannot + std::strerror(errno));
  return text.str();
}

std::string_view trim_whitespace(std::string_view s) {
  constexpr std::string_view space = " \t\r\n\v\f";
  const auto first = s.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

}  // namespace dplb::config::detail
