// Prefill/decode disaggregation's configuration: --prefill and --decode (and DPLB_PREFILL, DPLB_DECODE, the
// file's "prefill" and "decode", a cluster's lists), the two pools each becomes (a decode cluster that
// requests go to, and its prefill pool with --prefill-policy), and the combinations refused.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "dplb/config/settings.hpp"
#include "parse_helpers.hpp"

namespace cfg = dplb::config;
using json = nlohmann::json;
using cfg::rank_role;
using cfg::test::error_of;
using cfg::test::run;
using cfg::test::temp_dir;
using cfg::test::urls_of;

TEST_CASE("config pd: --prefill and --decode make one cluster of two pools, prefill ranks numbered first",
          "[config][pd]") {
  const auto s = run({"--prefill", "http://p1:8000,http://p2:8000", "--decode", "http://d1:8000#dp=2", "--policy",
                      "round-robin", "--prefill-policy", "least-tokens"});
  REQUIRE(s.clusters.size() == 2);
  const auto& decode = s.clusters[0];
  const auto& prefill = s.clusters[1];
  CHECK(decode.name == "default");
  CHECK(decode.role == rank_role::decode);
  CHECK(decode.disaggregated());
  CHECK(decode.prefill_pool == std::optional<std::size_t>(1));
  CHECK(decode.policy == "round-robin");
  CHECK(prefill.name == "default");
  CHECK(prefill.role == rank_role::prefill);
  CHECK(prefill.decode_pool == 0);
  CHECK(prefill.policy == "least-tokens");
  CHECK(s.default_cluster == 0);
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://p1:8000", "http://p2:8000", "http://d1:8000"});
  CHECK(s.backends[0].role == rank_role::prefill);
  CHECK(s.backends[0].cluster == 1);
  CHECK(s.backends[2].role == rank_role::decode);
  CHECK(s.backends[2].cluster == 0);
  CHECK(s.backends[2].dp == 2);
  CHECK(cfg::any_cluster_disaggregated(s));
  CHECK_FALSE(cfg::any_cluster_disaggregated(run({"--backend", "http://b:8000"})));
}

TEST_CASE("config pd: the environment and the file give the pools too, and the command line wins", "[config][pd]") {
  const auto env = run({}, {{"DPLB_PREFILL", "http://p:1"}, {"DPLB_DECODE", "http://d:1"}, {"DPLB_PREFILL_POLICY", "prefix-aware"},
                            {"DPLB_PD_SKIP_PREFILL_RATIO", "0.75"}});
  CHECK(urls_of(env.backends) == std::vector<std::string>{"http://p:1", "http://d:1"});
  CHECK(env.clusters[1].policy == "prefix-aware");
  CHECK(env.pd_skip_prefill_ratio == 0.75);

  temp_dir dir;
  const auto path = dir.write_json("dplb.json", json{{"prefill", {"http://p:2"}}, {"decode", "http://d:2,http://d:3"}});
  const auto file = run({"--config", path});
  CHECK(urls_of(file.backends) == std::vector<std::string>{"http://p:2", "http://d:2", "http://d:3"});
  // A higher source replaces the file's lists whole: co-located ranks from the command line.
  const auto flat = run({"--config", path, "--backend", "http://b:1"});
  CHECK(urls_of(flat.backends) == std::vector<std::string>{"http://b:1"});
  CHECK_FALSE(cfg::any_cluster_disaggregated(flat));
}

TEST_CASE("config pd: a cluster of the file with prefill and decode lists gets a prefill pool after every cluster",
          "[config][pd]") {
  temp_dir dir;
  const json clusters = json::array(
      {{{"name", "llama"}, {"models", {"llama"}}, {"backends", {"http://l:1"}}},
       {{"name", "moe"}, {"models", {"moe"}}, {"prefill", {"http://p:1"}}, {"decode", {"http://d:1", "http://d:2"}},
        {"policy", "round-robin"}, {"prefill_policy", "least-tokens"}, {"default", true}}});
  const auto s = run({"--config", dir.write_json("dplb.json", json{{"clusters", clusters}})});
  REQUIRE(s.clusters.size() == 3);
  CHECK(s.clusters[0].role == rank_role::both);
  CHECK(s.clusters[1].role == rank_role::decode);
  CHECK(s.clusters[1].prefill_pool == std::optional<std::size_t>(2));
  CHECK(s.clusters[2].name == "moe");
  CHECK(s.clusters[2].role == rank_role::prefill);
  CHECK(s.clusters[2].policy == "least-tokens");
  CHECK(s.clusters[2].models.empty());
  CHECK(s.default_cluster == 1);
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://l:1", "http://p:1", "http://d:1", "http://d:2"});
  CHECK(s.backends[1].cluster == 2);
  CHECK(s.backends[2].cluster == 1);
}

TEST_CASE("config pd: what is refused says what to do", "[config][pd]") {
  CHECK_THAT(error_of({"--prefill", "http://p:1"}), Catch::Contains("--prefill is given without --decode"));
  CHECK_THAT(error_of({"--decode", "http://d:1"}), Catch::Contains("--decode is given without --prefill"));
  CHECK_THAT(error_of({"--backend", "http://b:1", "--prefill", "http://p:1", "--decode", "http://d:1"}),
             Catch::Contains("both --backend and --prefill/--decode"));
  // One engine in both pools would prefill and decode on itself.
  CHECK_THAT(error_of({"--prefill", "http://e:1", "--decode", "http://e:1"}), Catch::Contains("duplicate --decode"));
  CHECK_THAT(error_of({"--prefill", "ftp://p:1", "--decode", "http://d:1"}), Catch::Contains("invalid --prefill"));
  // Never merged from two sources.
  CHECK_THAT(error_of({"--prefill", "http://p:1"}, {{"DPLB_DECODE", "http://d:1"}}),
             Catch::Contains("--prefill is given without --decode in the command line (the other list is in the "
                             "environment)"));
  CHECK_THAT(error_of({"--prefill", "http://p:1", "--decode", "http://d:1", "--pd-skip-prefill-ratio", "1.5"}),
             Catch::Contains("from 0 to 1"));
  CHECK_THAT(error_of({"--prefill", "http://p:1", "--decode", "http://d:1", "--prefill-policy", "fastest"}),
             Catch::Contains("invalid --prefill-policy"));

  temp_dir dir;
  const auto both_lists = dir.write_json(
      "a.json", json{{"clusters", {{{"name", "c"}, {"models", {"m"}}, {"backends", {"http://b:1"}}, {"prefill", {"http://p:1"}}}}}});
  CHECK_THAT(error_of({"--config", both_lists}), Catch::Contains("has both \"backends\" and \"prefill\"/\"decode\""));
  const auto half = dir.write_json("b.json", json{{"clusters", {{{"name", "c"}, {"models", {"m"}}, {"decode", {"http://d:1"}}}}}});
  CHECK_THAT(error_of({"--config", half}), Catch::Contains("has \"decode\" without \"prefill\""));
  const auto stray_policy = dir.write_json(
      "c.json", json{{"clusters", {{{"name", "c"}, {"models", {"m"}}, {"backends", {"http://b:1"}}, {"prefill_policy", "random"}}}}});
  CHECK_THAT(error_of({"--config", stray_policy}), Catch::Contains("has a \"prefill_policy\" but no \"prefill\""));
  const auto beside = dir.write_json(
      "d.json", json{{"clusters", {{{"name", "c"}, {"backends", {"http://b:1"}}}}}, {"decode", {"http://d:1"}}});
  CHECK_THAT(error_of({"--config", beside}), Catch::Contains("has both \"clusters\" and \"decode\""));
}
