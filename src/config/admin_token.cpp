#include "dplb/config/admin_token.hpp"

#include <sys/stat.h>

#include <cstdio>

#include "dplb/config/settings.hpp"
#include "text_file.hpp"

namespace dplb::config {

std::string read_admin_token_file(const std::string& path) {
  std::string token(detail::trim_whitespace(detail::read_text_file(path, "admin token file")));
  if (token.empty()) throw config_error("admin token file '" + path + "' is empty; put the token in it");
  return token;
}

std::string admin_token_file_exposure(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & (S_IRWXG | S_IRWXO)) == 0) return {};
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return "admin token file '" + path + "' has mode " + mode +
         ": its group or others may read or change the token that drives the admin API; chmod 600 it";
}

}  // namespace dplb::config
