// The admin token's file: read and trimmed (settings_sources_test.cpp checks it through every source), and
// named with its mode when its group or others may access it (dplb warns at start and on SIGHUP).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "dplb/config/admin_token.hpp"
#include "dplb/config/settings.hpp"
#include "parse_helpers.hpp"

namespace cfg = dplb::config;
using dplb::config::test::temp_dir;

TEST_CASE("an admin token file its group or others may access is named with its mode", "[config][admin]") {
  temp_dir dir;
  const std::string path = dir.write("token", "secret\n");
  for (const ::mode_t owner_only : {0600, 0400, 0700}) {
    INFO("mode " << std::oct << owner_only);
    REQUIRE(::chmod(path.c_str(), owner_only) == 0);
    CHECK(cfg::admin_token_file_exposure(path).empty());
  }
  for (const ::mode_t exposed : {0640, 0604, 0620, 0602, 0644, 0660}) {
    INFO("mode " << std::oct << exposed);
    REQUIRE(::chmod(path.c_str(), exposed) == 0);
    const auto why = cfg::admin_token_file_exposure(path);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(exposed));
    CHECK(why == "admin token file '" + path + "' has mode " + mode +
                     ": its group or others may read or change the token that drives the admin API; chmod 600 it");
    CHECK(why.find("secret") == std::string::npos);
  }
  // A file that is not there exposes nothing: reading it says why it cannot be read.
  CHECK(cfg::admin_token_file_exposure((dir.path() / "missing").string()).empty());
}

TEST_CASE("the admin token file is read again as at start: trimmed, and refused empty or unreadable",
          "[config][admin]") {
  temp_dir dir;
  CHECK(cfg::read_admin_token_file(dir.write("token", "  next-token \n")) == "next-token");
  CHECK_THROWS_WITH(cfg::read_admin_token_file(dir.write("blank", "\n")),
                    Catch::EndsWith("is empty; put the token in it"));
  CHECK_THROWS_AS(cfg::read_admin_token_file((dir.path() / "missing").string()), cfg::config_error);
  CHECK_THROWS_WITH(cfg::read_admin_token_file(dir.path().string()), Catch::EndsWith("it is a directory"));
}
