// Arrows point down: the layers include only what is below them (docs/architecture.md). A policy (the
// balancer) includes no metrics header, its shared building blocks live in support/; the configuration
// includes nothing of the balancer: it needs only the list of the policies' names, which lives in support/
// (support/policy_names.hpp) and includes nothing of dplb. The KV-cache events layer (kv/) is a leaf: it
// includes nothing of dplb but itself. The tenants include nothing of the admin API or the server (the SHA-256
// of their keys is support's).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// The repository root, from this file's path (ccache may make __FILE__ relative to the build directory,
// the parent of the tests/ directory holding the test binary).
fs::path source_root() {
  fs::path here = __FILE__;
  if (here.is_relative()) here = fs::canonical("/proc/self/exe").parent_path().parent_path() / here;
  return here.lexically_normal().parent_path().parent_path().parent_path().parent_path();
}

// Every "dplb/..." header included by the files under the given folders of the repository.
std::vector<std::string> dplb_includes(const std::vector<std::string>& folders) {
  static const std::regex include(R"(^\s*#\s*include\s*"(dplb/[^"]+)\")");
  std::vector<std::string> out;
  for (const auto& folder : folders) {
    const auto dir = source_root() / folder;
    REQUIRE(fs::is_directory(dir));
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path());
      for (std::string line; std::getline(in, line);) {
        std::smatch m;
        if (std::regex_search(line, m, include)) out.push_back(entry.path().filename().string() + " -> " + m[1].str());
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("no policy includes a metrics header", "[layering]") {
  const auto includes = dplb_includes({"src/balancer", "include/dplb/balancer"});
  REQUIRE_FALSE(includes.empty());
  for (const auto& i : includes) {
    INFO(i);
    CHECK(i.find("-> dplb/metrics/") == std::string::npos);
    CHECK(i.find("-> dplb/server/") == std::string::npos);
    CHECK(i.find("-> dplb/app/") == std::string::npos);
  }
}

TEST_CASE("the configuration includes nothing of the balancer", "[layering]") {
  const auto includes = dplb_includes({"src/config", "include/dplb/config"});
  REQUIRE_FALSE(includes.empty());
  for (const auto& i : includes) {
    INFO(i);
    CHECK(i.find("-> dplb/balancer/") == std::string::npos);
  }
}

TEST_CASE("the policies' names include nothing of dplb", "[layering]") {
  // What the configuration may include of them: a leaf, so that no arrow can go up through it.
  const auto header = source_root() / "include/dplb/support/policy_names.hpp";
  REQUIRE(fs::is_regular_file(header));
  std::ifstream in(header);
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    INFO(line);
    CHECK(line.find("#include \"dplb/") == std::string::npos);
  }
  CHECK(lines > 0);
}

TEST_CASE("the KV-cache events layer includes nothing of dplb but itself", "[layering][kv]") {
  // kv/ decodes what the engines publish and indexes it; the balancer and the server will include it, so
  // it must not include them (nor the metrics, nor the configuration): its bounds come in as arguments.
  const auto includes = dplb_includes({"src/kv", "include/dplb/kv"});
  REQUIRE_FALSE(includes.empty());
  for (const auto& i : includes) {
    INFO(i);
    CHECK(i.find("-> dplb/kv/") != std::string::npos);
  }
}

TEST_CASE("the tenants include nothing of the admin API or the server", "[layering][tenants]") {
  // The admin API and the server read the tenants; the tenants' key digests come from support/sha256.hpp.
  const auto includes = dplb_includes({"src/tenants", "include/dplb/tenants"});
  REQUIRE_FALSE(includes.empty());
  for (const auto& i : includes) {
    INFO(i);
    CHECK(i.find("-> dplb/admin/") == std::string::npos);
    CHECK(i.find("-> dplb/server/") == std::string::npos);
  }
}

TEST_CASE("the shared ledger includes nothing of dplb but itself", "[layering][ledger]") {
  // ledger/ is the Redis client and the ledger's functions; the balancer, the server and the
  // configuration will include it (its settings come in as arguments), so it includes none of them.
  const auto includes = dplb_includes({"src/ledger", "include/dplb/ledger"});
  REQUIRE_FALSE(includes.empty());
  for (const auto& i : includes) {
    INFO(i);
    CHECK(i.find("-> dplb/ledger/") != std::string::npos);
  }
}
