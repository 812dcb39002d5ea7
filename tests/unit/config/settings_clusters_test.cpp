// Clusters: the config file's "clusters" (each with its models, backends and policy), the one implicit
// cluster every other configuration makes, how --backend and DPLB_BACKENDS replace the file's clusters,
// and every rule a cluster must follow.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dplb/config/settings.hpp"
#include "parse_helpers.hpp"

namespace cfg = dplb::config;
using json = nlohmann::json;

namespace {

using cfg::test::error_of;
using cfg::test::run;
using cfg::test::source_root;
using cfg::test::temp_dir;
using cfg::test::urls_of;

json llama_cluster() {
  return {{"name", "llama"},
          {"models", {"meta-llama/Llama-3.1-8B-Instruct"}},
          {"backends", {"http://10.0.0.1:8000#dp=4", "http://10.0.0.2:8000"}}};
}

json qwen_cluster() {
  return {{"name", "qwen"}, {"models", {"Qwen/Qwen3-30B-A3B", "qwen3"}}, {"backends", {"http://10.0.0.3:8000#dp=2&weight=2"}}};
}

// A config file holding these clusters (and the other keys of `rest`), in a directory of its own.
class clusters_file : public cfg::test::json_config_file {
 public:
  explicit clusters_file(const json& clusters, json rest = json::object())
      : json_config_file(with_clusters(clusters, std::move(rest))) {}

 private:
  static json with_clusters(const json& clusters, json rest) {
    rest["clusters"] = clusters;
    return rest;
  }
};

// The error a file with these clusters gets, with the file's path written as '%'.
std::string error_with(const json& clusters, const json& rest = json::object()) {
  const clusters_file file(clusters, rest);
  const std::string message = file.error();
  // Copied piece by piece: GCC 12 warns (-Wrestrict, falsely) about std::string::replace with a short string.
  std::string shown;
  std::size_t from = 0;
  for (auto at = message.find(file.path()); at != std::string::npos; at = message.find(file.path(), from)) {
    shown += message.substr(from, at - from) + "%";
    from = at + file.path().size();
  }
  return shown + message.substr(from);
}

json with(json cluster, const std::string& key, const json& value) {
  cluster[key] = value;
  return cluster;
}

json without(json cluster, const std::string& key) {
  cluster.erase(key);
  return cluster;
}

std::string text_of(const std::filesystem::path& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

cfg::cluster_spec implicit_cluster(const std::string& policy) { return {"default", {}, policy}; }

}  // namespace

TEST_CASE("without clusters, one implicit cluster named default holds every backend and serves every model", "[config][clusters]") {
  temp_dir dir;
  const std::string flat = dir.write_json("flat.json", json{{"backends", {"http://a:1#dp=2", "http://b:2"}}});
  for (const auto& s : {run({"--backend", "http://a:1#dp=2,http://b:2"}),
                        run({}, {{"DPLB_BACKENDS", "http://a:1#dp=2,http://b:2"}}), run({"--config", flat})}) {
    CHECK(s.clusters == std::vector<cfg::cluster_spec>{implicit_cluster("least-inflight")});
    CHECK(s.clusters.front().name == cfg::implicit_cluster_name);
    CHECK(s.default_cluster == 0);
    CHECK(s.backends == std::vector<cfg::backend_spec>{{"http://a:1", 2, 1, 0}, {"http://b:2", 1, 1, 0}});
  }
  // Its policy is the top-level one, from whichever source that came.
  CHECK(run({"--backend", "http://a:1", "--policy", "round-robin"}).clusters.front().policy == "round-robin");
  CHECK(run({"--backend", "http://a:1"}, {{"DPLB_POLICY", "least-load"}}).clusters.front().policy == "least-load");
}

TEST_CASE("clusters' backends are flattened in cluster order, ranks numbered globally, each with its cluster", "[config][clusters]") {
  const json third{{"name", "mistral"}, {"models", {"mistral-7b"}}, {"backends", "http://10.0.0.4:8000, http://10.0.0.5:8000"}};
  const auto s = clusters_file(json{llama_cluster(), qwen_cluster(), third}).run();
  CHECK(s.backends == std::vector<cfg::backend_spec>{{"http://10.0.0.1:8000", 4, 1, 0},  // ranks 0..3
                                                     {"http://10.0.0.2:8000", 1, 1, 0},  // rank 4
                                                     {"http://10.0.0.3:8000", 2, 2, 1},  // ranks 5 and 6
                                                     {"http://10.0.0.4:8000", 1, 1, 2},  // rank 7
                                                     {"http://10.0.0.5:8000", 1, 1, 2}});
  REQUIRE(s.clusters.size() == 3);
  CHECK(s.clusters[0] == cfg::cluster_spec{"llama", {"meta-llama/Llama-3.1-8B-Instruct"}, "least-inflight"});
  CHECK(s.clusters[1] == cfg::cluster_spec{"qwen", {"Qwen/Qwen3-30B-A3B", "qwen3"}, "least-inflight"});
  CHECK(s.clusters[2] == cfg::cluster_spec{"mistral", {"mistral-7b"}, "least-inflight"});
  CHECK(s.default_cluster == 0);
}

TEST_CASE("a cluster's policy is its own, else the top-level policy from whichever source set it", "[config][clusters]") {
  const json clusters{with(llama_cluster(), "policy", "Least-Load"), qwen_cluster()};
  const clusters_file file(clusters, json{{"policy", "round-robin"}});
  auto s = file.run();
  CHECK(s.policy == "round-robin");
  CHECK(s.clusters[0].policy == "least-load");  // stored canonical, as --policy is
  CHECK(s.clusters[1].policy == "round-robin");
  s = file.run({}, {{"DPLB_POLICY", "least-tokens"}});
  CHECK(s.clusters[0].policy == "least-load");
  CHECK(s.clusters[1].policy == "least-tokens");
  CHECK(file.run({"--policy", "random"}).clusters[1].policy == "random");
  CHECK(clusters_file(json{qwen_cluster()}).run().clusters[0].policy == "least-inflight");  // the default policy

  CHECK(error_with(json{with(qwen_cluster(), "policy", "fastest")}) ==
        "invalid \"policy\" 'fastest' of cluster 'qwen' in config file '%': expected round-robin, least-inflight, "
        "least-load, least-tokens, prefix-aware, random or engine-stats");
  CHECK(error_with(json{with(qwen_cluster(), "policy", 3)}) ==
        "\"policy\" of cluster 'qwen' in config file '%' must be a string, not number");
}

TEST_CASE("the default cluster is the one marked \"default\": true, else the first", "[config][clusters]") {
  CHECK(clusters_file(json{llama_cluster(), qwen_cluster()}).run().default_cluster == 0);
  CHECK(clusters_file(json{llama_cluster(), with(qwen_cluster(), "default", true)}).run().default_cluster == 1);
  CHECK(clusters_file(json{with(llama_cluster(), "default", false), qwen_cluster()}).run().default_cluster == 0);
  CHECK(clusters_file(json{with(llama_cluster(), "default", false), with(qwen_cluster(), "default", false)})
            .run()
            .default_cluster == 0);
  CHECK(error_with(json{with(llama_cluster(), "default", true), with(qwen_cluster(), "default", true)}) ==
        "clusters 'llama' and 'qwen' in config file '%' are both \"default\": true; mark one");
  CHECK(error_with(json{with(llama_cluster(), "default", "yes")}) ==
        "\"default\" of cluster 'llama' in config file '%' must be true or false, not string");
}

TEST_CASE("the file's clusters are replaced entirely by --backend and DPLB_BACKENDS", "[config][clusters]") {
  const clusters_file file(json{llama_cluster(), with(qwen_cluster(), "default", true)}, json{{"policy", "round-robin"}});
  const std::vector<cfg::cluster_spec> implicit{implicit_cluster("round-robin")};
  SECTION("--backend") {
    const auto s = file.run({"--backend", "http://cli:1"});
    CHECK(s.clusters == implicit);
    CHECK(s.default_cluster == 0);
    CHECK(s.backends == std::vector<cfg::backend_spec>{{"http://cli:1", 1, 1, 0}});
  }
  SECTION("DPLB_BACKENDS") {
    const auto s = file.run({}, {{"DPLB_BACKENDS", "http://env:1,http://env:2"}});
    CHECK(s.clusters == implicit);
    CHECK(s.default_cluster == 0);
    CHECK(urls_of(s.backends) == std::vector<std::string>{"http://env:1", "http://env:2"});
  }
  SECTION("clusters that are replaced are not validated, as any overridden value") {
    const clusters_file broken(json{with(llama_cluster(), "policy", "fastest"), without(qwen_cluster(), "models")});
    CHECK(broken.run({"--backend", "http://cli:1"}).clusters == std::vector<cfg::cluster_spec>{implicit_cluster("least-inflight")});
    CHECK(clusters_file(json("not an array")).run({}, {{"DPLB_BACKENDS", "http://env:1"}}).clusters.size() == 1);
  }
  SECTION("an empty DPLB_BACKENDS counts as unset: the file's clusters stand") {
    CHECK(file.run({}, {{"DPLB_BACKENDS", ""}}).clusters.size() == 2);
  }
}

TEST_CASE("a config file with both clusters and backends is refused, even when --backend replaces both", "[config][clusters]") {
  const clusters_file file(json{llama_cluster()}, json{{"backends", {"http://a:1"}}});
  const std::string expected = "config file '" + file.path() +
                               "' has both \"clusters\" and \"backends\"; move the backends into a cluster's "
                               "\"backends\" (or drop \"clusters\")";
  CHECK(file.error() == expected);
  CHECK(file.error({"--backend", "http://cli:1"}) == expected);
}

TEST_CASE("clusters must be a non-empty array of objects", "[config][clusters]") {
  CHECK(error_with(json::object()) ==
        "key 'clusters' in config file '%' must be an array of cluster objects, not object");
  CHECK(error_with("llama") == "key 'clusters' in config file '%' must be an array of cluster objects, not string");
  CHECK(error_with(json::array()) ==
        "key 'clusters' in config file '%' is empty; define at least one cluster (or remove the key)");
  CHECK(error_with(json{llama_cluster(), "qwen"}) ==
        "clusters[1] in config file '%' must be an object, e.g. {\"name\": \"llama\", \"models\": [...], "
        "\"backends\": [...]}, not string");
}

TEST_CASE("a cluster's name is required, of [A-Za-z0-9._-] (1 to 64), and unique", "[config][clusters]") {
  for (const std::string& good : std::vector<std::string>{"a", "Llama-3.1_8B", std::string(64, 'x')}) {
    INFO(good);
    CHECK(clusters_file(json{with(llama_cluster(), "name", good)}).run().clusters[0].name == good);
  }
  CHECK(error_with(json{llama_cluster(), without(qwen_cluster(), "name")}) ==
        "clusters[1] in config file '%' has no \"name\"; give each cluster a name of letters, digits, '.', '_' or '-'");
  CHECK(error_with(json{with(llama_cluster(), "name", 7)}) ==
        "\"name\" of clusters[0] in config file '%' must be a string, not number");
  for (const std::string& bad :
       std::vector<std::string>{"", "two words", "a/b", "llama{x}", "\xc3\xa9t\xc3\xa9", std::string(65, 'x')}) {
    INFO(bad);
    CHECK(error_with(json{with(llama_cluster(), "name", bad)}) ==
          "invalid \"name\" '" + bad +
              "' of clusters[0] in config file '%': use 1 to 64 letters, digits, '.', '_' or '-' (it labels the "
              "cluster's metrics)");
  }
  CHECK(error_with(json{llama_cluster(), qwen_cluster(), with(qwen_cluster(), "models", {"other"})}) ==
        "two clusters are named 'qwen' in config file '%' (clusters[1] and clusters[2]); give each its own name");
}

TEST_CASE("a cluster's models: a non-empty array of names, none twice, none in two clusters", "[config][clusters]") {
  CHECK(error_with(json{without(llama_cluster(), "models")}) ==
        "cluster 'llama' in config file '%' has no \"models\"; list the model names it serves (the requests' "
        "\"model\")");
  CHECK(error_with(json{with(llama_cluster(), "models", "llama")}) ==
        "\"models\" of cluster 'llama' in config file '%' must be an array of model names, not string");
  CHECK(error_with(json{with(llama_cluster(), "models", json::array())}) ==
        "\"models\" of cluster 'llama' in config file '%' is empty; list the model names it serves");
  CHECK(error_with(json{with(llama_cluster(), "models", {"llama", 3})}) ==
        "\"models\" of cluster 'llama' in config file '%' must be an array of model names (strings), not number");
  CHECK(error_with(json{with(llama_cluster(), "models", {"llama", ""})}) ==
        "\"models\" of cluster 'llama' in config file '%' holds an empty model name; remove it");
  CHECK(error_with(json{with(llama_cluster(), "models", {"llama", "llama"})}) ==
        "model 'llama' is listed twice in cluster 'llama' in config file '%'; list it once");
  CHECK(error_with(json{with(llama_cluster(), "models", {"llama", "qwen3"}), qwen_cluster()}) ==
        "model 'qwen3' is listed by cluster 'llama' and by cluster 'qwen' in config file '%'; a model belongs to "
        "one cluster");
  // Names are compared exactly, as vLLM compares served model names.
  const auto s = clusters_file(json{with(llama_cluster(), "models", {"Qwen3"}), qwen_cluster()}).run();
  CHECK(s.clusters[0].models == std::vector<std::string>{"Qwen3"});
}

TEST_CASE("a cluster's backends: required, parsed as --backend, each engine in one cluster and once", "[config][clusters]") {
  CHECK(error_with(json{without(llama_cluster(), "backends")}) ==
        "cluster 'llama' in config file '%' has no \"backends\"; list the URLs of the engines that serve its models (or \"prefill\" and \"decode\" for disaggregated serving)");
  for (const json& empty : {json::array(), json("")}) {
    INFO(empty.dump());
    CHECK_THAT(error_with(json{with(llama_cluster(), "backends", empty)}),
               Catch::Contains("cluster 'llama' in config file '%'"));
  }
  CHECK(error_with(json{with(llama_cluster(), "backends", json::array())}) ==
        "\"backends\" of cluster 'llama' in config file '%' is empty; list the URLs of the engines that serve its "
        "models");
  CHECK(error_with(json{with(llama_cluster(), "backends", {{{"url", "http://a:1"}}})}) ==
        "\"backends\" of cluster 'llama' in config file '%' must be an array of URL strings, not object");
  CHECK(error_with(json{with(llama_cluster(), "backends", 8000)}) ==
        "\"backends\" of cluster 'llama' in config file '%' must be an array of URL strings, not number");
  CHECK(error_with(json{llama_cluster(), with(qwen_cluster(), "backends", {"https://10.0.0.9:8000"})}) ==
        "invalid --backend 'https://10.0.0.9:8000' (from \"backends\" of cluster 'qwen' in config file '%'): https "
        "is not supported (dplb talks plain HTTP to the engines); use http://HOST:PORT");
  CHECK(error_with(json{with(llama_cluster(), "backends", {"http://a:1#dp=0"})}) ==
        "invalid --backend 'http://a:1#dp=0' (from \"backends\" of cluster 'llama' in config file '%'): dp must be "
        "the number of DP ranks behind the URL, 1 to 1024");
  CHECK(error_with(json{with(llama_cluster(), "backends", {"http://a:1", "http://A:1/#weight=2"})}) ==
        "duplicate --backend 'http://A:1/#weight=2' (from \"backends\" of cluster 'llama' in config file '%'): same "
        "engine as rank 0 ('http://a:1' of cluster 'llama'); list each engine once, in one cluster");
  CHECK(error_with(json{llama_cluster(), with(qwen_cluster(), "backends", {"http://10.0.0.2:8000/"})}) ==
        "duplicate --backend 'http://10.0.0.2:8000/' (from \"backends\" of cluster 'qwen' in config file '%'): same "
        "engine as rank 4 ('http://10.0.0.2:8000' of cluster 'llama'); list each engine once, in one cluster");
}

TEST_CASE("the rank limit applies over all clusters together", "[config][clusters]") {
  const json half{"http://a:1#dp=1024", "http://b:1#dp=1024"};
  const json other_half{"http://c:1#dp=1024", "http://d:1#dp=1024"};
  const auto s = clusters_file(json{with(llama_cluster(), "backends", half), with(qwen_cluster(), "backends", other_half)}).run();
  CHECK(s.backends.size() == 4);  // exactly 4096 ranks
  const json one_more{"http://c:1#dp=1024", "http://d:1#dp=1024", "http://e:1"};
  CHECK(error_with(json{with(llama_cluster(), "backends", half), with(qwen_cluster(), "backends", one_more)}) ==
        "too many ranks (from \"backends\" of cluster 'qwen' in config file '%'): the backends add up to more than "
        "4096 DP ranks over all clusters");
}

TEST_CASE("unknown or repeated keys in a cluster are refused, naming the cluster", "[config][clusters]") {
  CHECK(error_with(json{with(llama_cluster(), "modles", {"x"})}) ==
        "unknown key 'modles' in cluster 'llama' in config file '%' (did you mean 'models'?)");
  CHECK(error_with(json{with(llama_cluster(), "weight", 2)}) ==
        "unknown key 'weight' in cluster 'llama' in config file '%'; known keys: name, models, backends, policy, "
        "default, prefill, decode, prefill_policy");
  // Before the name is known, the cluster is called by its place.
  CHECK(error_with(json{with(without(llama_cluster(), "name"), "nmae", "llama")}) ==
        "unknown key 'nmae' in clusters[0] in config file '%' (did you mean 'name'?)");
  temp_dir dir;
  const std::string repeated = dir.write(
      "repeated.json", R"({"clusters": [{"name": "a", "models": ["m"], "models": ["n"], "backends": ["http://a:1"]}]})");
  CHECK(error_of({"--config", repeated}) ==
        "key 'models' appears twice in an object under 'clusters' in config file '" + repeated + "'");
  // The top-level keys: "clusters" is one, listed and suggested like the options' keys.
  CHECK_THAT(error_with(json{llama_cluster()}, json{{"clustres", 1}}), Catch::Contains("(did you mean 'clusters'?)"));
  CHECK_THAT(error_with(json{llama_cluster()}, json{{"tls_certificate", 1}}), Catch::EndsWith(", clusters"));
}

TEST_CASE("both shipped example config files parse", "[config][clusters]") {
  const std::filesystem::path flat = source_root() / "config" / "dplb.example.json";
  const std::filesystem::path clustered = source_root() / "config" / "dplb.clusters.example.json";
  INFO(clustered.string());
  REQUIRE(std::filesystem::exists(flat));
  REQUIRE(std::filesystem::exists(clustered));

  const auto one = run({"--config", flat.string()});
  CHECK(one.clusters == std::vector<cfg::cluster_spec>{implicit_cluster("least-inflight")});

  const auto two = run({"--config", clustered.string()});
  CHECK(two.clusters == std::vector<cfg::cluster_spec>{
                            {"llama", {"meta-llama/Llama-3.1-8B-Instruct"}, "least-load"},
                            {"qwen", {"Qwen/Qwen3-30B-A3B", "qwen3"}, "least-inflight"},
                        });
  CHECK(two.default_cluster == 0);
  CHECK(two.backends == std::vector<cfg::backend_spec>{{"http://127.0.0.1:8100", 4, 1, 0},
                                                       {"http://127.0.0.1:8101", 1, 1, 0},
                                                       {"http://127.0.0.1:8102", 2, 2, 1}});
  // docs/configuration.md shows the clusters example whole: the two must not drift apart.
  CHECK_THAT(text_of(source_root() / "docs" / "configuration.md"), Catch::Contains(text_of(clustered)));
}

TEST_CASE("option --help tells where clusters are defined", "[config][clusters]") {
  const std::string help = cfg::help_text();
  CHECK_THAT(help, Catch::Contains("\"clusters\""));
  CHECK_THAT(help, Catch::Contains("docs/configuration.md"));
}
