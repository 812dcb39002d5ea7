// Where settings come from: each source alone (command line, DPLB_* environment, JSON config file), the
// precedence between every pair of them, and every way a config file can be wrong.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "dplb/config/settings.hpp"
#include "parse_helpers.hpp"

namespace cfg = dplb::config;
using json = nlohmann::json;

namespace {

using cfg::test::error_of;
using cfg::test::parse;
using cfg::test::run;
using cfg::test::source_root;
using cfg::test::temp_dir;
using cfg::test::urls_of;

// The naming contract: --log-format is DPLB_LOG_FORMAT and "log_format"; --backend is the one exception
// (DPLB_BACKENDS, "backends") because it names a list.
std::string env_name(const std::string& flag) {
  if (flag == "backend") return "DPLB_BACKENDS";
  std::string name = "DPLB_" + flag;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return c == '-' ? '_' : static_cast<char>(std::toupper(c)); });
  return name;
}

std::string config_key(const std::string& flag) {
  if (flag == "backend") return "backends";
  std::string key = flag;
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

// One non-default value per option, as text (command line, environment) and as JSON (config file), with the
// check that it arrived.
struct option_case {
  std::string flag;
  std::string text;
  json in_file;
  std::function<bool(const cfg::settings&)> arrived;
};

std::vector<option_case> every_option() {
  using ms = std::chrono::milliseconds;
  return {
      {"listen", "127.0.0.2:9001", "127.0.0.2:9001",
       [](const cfg::settings& s) { return s.listen.host == "127.0.0.2" && s.listen.port == 9001; }},
      {"backend", "http://10.0.0.7:8100", json::array({"http://10.0.0.7:8100"}),
       [](const cfg::settings& s) { return urls_of(s.backends) == std::vector<std::string>{"http://10.0.0.7:8100"}; }},
      {"policy", "round-robin", "round-robin", [](const cfg::settings& s) { return s.policy == "round-robin"; }},
      {"stats-interval", "300", 300, [](const cfg::settings& s) { return s.stats_interval == ms(300); }},
      {"threads", "12", 12, [](const cfg::settings& s) { return s.threads == 12; }},
      {"log-level", "error", "error", [](const cfg::settings& s) { return s.log_level == "error"; }},
      {"log-format", "json", "json", [](const cfg::settings& s) { return s.log_fmt == cfg::log_format::json; }},
      {"max-request-body-bytes", "2000000", 2000000,
       [](const cfg::settings& s) { return s.max_request_body_bytes == 2000000; }},
      {"max-header-bytes", "20000", 20000, [](const cfg::settings& s) { return s.max_header_bytes == 20000; }},
      {"client-idle-timeout-ms", "2001", 2001, [](const cfg::settings& s) { return s.client_idle_timeout == ms(2001); }},
      {"request-read-timeout-ms", "2002", 2002,
       [](const cfg::settings& s) { return s.request_read_timeout == ms(2002); }},
      {"upstream-connect-timeout-ms", "2003", 2003,
       [](const cfg::settings& s) { return s.upstream_connect_timeout == ms(2003); }},
      {"upstream-read-timeout-ms", "2004", 2004,
       [](const cfg::settings& s) { return s.upstream_read_timeout == ms(2004); }},
      {"client-write-timeout-ms", "2005", 2005,
       [](const cfg::settings& s) { return s.client_write_timeout == ms(2005); }},
      {"upstream-idle-timeout-ms", "2006", 2006,
       [](const cfg::settings& s) { return s.upstream_idle_timeout == ms(2006); }},
      {"upstream-max-idle-per-rank", "9", 9, [](const cfg::settings& s) { return s.upstream_max_idle_per_rank == 9; }},
      {"upstream-first-byte-timeout-ms", "2007", 2007,
       [](const cfg::settings& s) { return s.upstream_first_byte_timeout == ms(2007); }},
      {"max-retries", "5", 5, [](const cfg::settings& s) { return s.max_retries == 5; }},
      {"health-check-interval-ms", "2008", 2008,
       [](const cfg::settings& s) { return s.health_check_interval == ms(2008); }},
      {"health-check-timeout-ms", "2009", 2009,
       [](const cfg::settings& s) { return s.health_check_timeout == ms(2009); }},
      {"unhealthy-threshold", "7", 7, [](const cfg::settings& s) { return s.unhealthy_threshold == 7; }},
      {"healthy-threshold", "8", 8, [](const cfg::settings& s) { return s.healthy_threshold == 8; }},
      {"ejection-threshold", "11", 11, [](const cfg::settings& s) { return s.ejection_threshold == 11; }},
      {"ejection-base-ms", "2010", 2010, [](const cfg::settings& s) { return s.ejection_base == ms(2010); }},
      {"ejection-max-ms", "2011", 2011, [](const cfg::settings& s) { return s.ejection_max == ms(2011); }},
      {"max-client-connections", "77", 77, [](const cfg::settings& s) { return s.max_client_connections == 77; }},
      {"max-ejected-percent", "25", 25, [](const cfg::settings& s) { return s.max_ejected_percent == 25; }},
      {"max-inflight-per-rank", "64", 64, [](const cfg::settings& s) { return s.max_inflight_per_rank == 64; }},
      {"max-queued-requests", "99", 99, [](const cfg::settings& s) { return s.max_queued_requests == 99; }},
      {"queue-timeout-ms", "2013", 2013, [](const cfg::settings& s) { return s.queue_timeout == ms(2013); }},
      {"drain-timeout-ms", "2012", 2012, [](const cfg::settings& s) { return s.drain_timeout == ms(2012); }},
  };
}

const std::string a_backend = "http://127.0.0.1:8100";

}  // namespace

TEST_CASE("each option is read from each source alone", "[config]") {
  temp_dir dir;
  for (const auto& c : every_option()) {
    INFO("option --" << c.flag);
    const bool is_backend = c.flag == "backend";
    // Every run needs a backend; when the option under test is not --backend, it comes from the
    // command line so that the source under test holds only the one option.
    const std::vector<std::string> base = is_backend ? std::vector<std::string>{}
                                                     : std::vector<std::string>{"--backend", a_backend};

    auto with_cli = base;
    with_cli.insert(with_cli.end(), {"--" + c.flag, c.text});
    CHECK(c.arrived(run(with_cli)));

    CHECK(c.arrived(run(base, {{env_name(c.flag), c.text}})));

    const std::string file = dir.write_json(config_key(c.flag) + ".json", json{{config_key(c.flag), c.in_file}});
    auto with_file = base;
    with_file.insert(with_file.end(), {"--config", file});
    const auto s = run(with_file);
    CHECK(c.arrived(s));
    CHECK(s.config_file == file);

    // Without it, the same run keeps the default.
    if (!is_backend) CHECK_FALSE(c.arrived(run(base)));
  }
}

TEST_CASE("the config file is named by --config or DPLB_CONFIG", "[config]") {
  temp_dir dir;
  const std::string file = dir.write_json("dplb.json", json{{"backends", {a_backend}}, {"policy", "round-robin"}});
  SECTION("--config") {
    const auto s = run({"--config", file});
    CHECK(s.policy == "round-robin");
    CHECK(s.config_file == file);
  }
  SECTION("DPLB_CONFIG") {
    const auto s = run({}, {{"DPLB_CONFIG", file}});
    CHECK(s.policy == "round-robin");
    CHECK(s.config_file == file);
  }
  SECTION("--config beats DPLB_CONFIG, whose file is then not read at all") {
    const auto s = run({"--config", file}, {{"DPLB_CONFIG", (dir.path() / "missing.json").string()}});
    CHECK(s.policy == "round-robin");
    CHECK(s.config_file == file);
  }
}

TEST_CASE("the environment and the config file take backend lists in both spellings", "[config]") {
  const std::vector<std::string> ranks{"http://a:1", "http://b:2", "http://c:3"};
  CHECK(urls_of(run({}, {{"DPLB_BACKENDS", "http://a:1,http://b:2,http://c:3"}}).backends) == ranks);
  CHECK(urls_of(run({}, {{"DPLB_BACKENDS", "http://a:1, http://b:2 ,http://c:3/"}}).backends) == ranks);

  temp_dir dir;
  CHECK(urls_of(run({"--config", dir.write_json("array.json", json{{"backends", ranks}})}).backends) == ranks);
  CHECK(urls_of(run({"--config", dir.write_json("string.json", json{{"backends", "http://a:1,http://b:2,http://c:3"}})})
                    .backends) == ranks);
}

TEST_CASE("an empty environment variable counts as unset", "[config]") {
  const auto s = run({"--backend", a_backend}, {{"DPLB_POLICY", ""}, {"DPLB_THREADS", ""}, {"DPLB_LISTEN", ""}});
  CHECK(s.policy == "least-inflight");
  CHECK(s.threads == 0);
  CHECK(s.listen.port == 8000);
  CHECK(error_of({}, {{"DPLB_BACKENDS", ""}}) ==
        "no backend given: pass --backend http://HOST:PORT (repeatable) or set DPLB_BACKENDS (or --prefill and --decode for disaggregated serving)");
}

TEST_CASE("precedence: command line over environment", "[config]") {
  const cfg::environment env{{"DPLB_BACKENDS", "http://env:1,http://env:2"},
                             {"DPLB_POLICY", "round-robin"},
                             {"DPLB_THREADS", "3"},
                             {"DPLB_LISTEN", "127.0.0.1:7000"}};
  const auto s = run({"--backend", "http://cli:1", "--policy", "least-inflight", "--threads", "5"}, env);
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://cli:1"});  // replaced whole, not merged
  CHECK(s.policy == "least-inflight");
  CHECK(s.threads == 5);
  CHECK(s.listen.host == "127.0.0.1");  // per option: not given on the command line, so from the environment
  CHECK(s.listen.port == 7000);
}

TEST_CASE("precedence: environment over config file", "[config]") {
  temp_dir dir;
  const std::string file = dir.write_json("dplb.json", json{{"backends", {"http://file:1", "http://file:2"}},
                                                       {"policy", "round-robin"},
                                                       {"threads", 3},
                                                       {"log_level", "debug"}});
  const auto s = run({"--config", file}, {{"DPLB_BACKENDS", "http://env:1"}, {"DPLB_POLICY", "least-inflight"}});
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://env:1"});
  CHECK(s.policy == "least-inflight");
  CHECK(s.threads == 3);  // only in the file
  CHECK(s.log_level == "debug");
}

TEST_CASE("precedence: command line over config file", "[config]") {
  temp_dir dir;
  const std::string file = dir.write_json(
      "dplb.json", json{{"backends", "http://file:1,http://file:2"}, {"policy", "round-robin"}, {"threads", 3}});
  const auto s = run({"--config", file, "--backend", "http://cli:9", "--threads", "7"});
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://cli:9"});
  CHECK(s.threads == 7);
  CHECK(s.policy == "round-robin");  // only in the file
}

TEST_CASE("precedence: all three sources and the default, option by option", "[config]") {
  temp_dir dir;
  const std::string file = dir.write_json("dplb.json", json{{"backends", {"http://file:1"}},
                                                       {"threads", 1},
                                                       {"policy", "round-robin"},
                                                       {"listen", "127.0.0.1:1111"}});
  const cfg::environment env{{"DPLB_CONFIG", file},
                             {"DPLB_BACKENDS", "http://env:1"},
                             {"DPLB_THREADS", "2"},
                             {"DPLB_POLICY", "least-inflight"}};
  const auto s = run({"--threads", "3"}, env);
  CHECK(s.threads == 3);                       // command line
  CHECK(s.policy == "least-inflight");         // environment
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://env:1"});
  CHECK(s.listen.host == "127.0.0.1");         // file
  CHECK(s.listen.port == 1111);
  CHECK(s.log_level == "info");                // default
  CHECK(s.config_file == file);
}

TEST_CASE("a value overridden by a higher-precedence source is not validated", "[config]") {
  temp_dir dir;
  const std::string file = dir.write_json("dplb.json", json{{"policy", "fastest"}, {"threads", 999}});
  const auto s = run({"--config", file, "--backend", a_backend, "--policy", "round-robin"}, {{"DPLB_THREADS", "4"}});
  CHECK(s.policy == "round-robin");
  CHECK(s.threads == 4);
  CHECK(run({"--backend", a_backend, "--threads", "2"}, {{"DPLB_THREADS", "lots"}}).threads == 2);
}

TEST_CASE("bad values from the environment name the option, the variable and the value", "[config]") {
  CHECK(error_of({"--backend", a_backend}, {{"DPLB_POLICY", "fastest"}}) ==
        "invalid --policy 'fastest' (from DPLB_POLICY): expected round-robin, least-inflight, least-load, least-tokens, prefix-aware, random or "
        "engine-stats");
  CHECK(error_of({"--backend", a_backend}, {{"DPLB_THREADS", "many"}}) ==
        "invalid --threads 'many' (from DPLB_THREADS): expected a whole number from 0 to 256 (threads)");
  CHECK(error_of({}, {{"DPLB_BACKENDS", "https://h:1"}}) ==
        "invalid --backend 'https://h:1' (from DPLB_BACKENDS): https is not supported (dplb talks plain HTTP to "
        "the engines); use http://HOST:PORT");
  CHECK(error_of({}, {{"DPLB_BACKENDS", "http://h:1,http://h:1"}}) ==
        "duplicate --backend 'http://h:1' (from DPLB_BACKENDS): same engine as rank 0 ('http://h:1'); list each "
        "engine once");
  CHECK_THAT(error_of({"--backend", a_backend}, {{"DPLB_LISTEN", "8000"}}),
             Catch::StartsWith("invalid --listen '8000' (from DPLB_LISTEN): expected HOST:PORT"));
}

TEST_CASE("bad values from the config file name the option, the key, the file and the value", "[config]") {
  temp_dir dir;
  const std::string file = dir.write_json("dplb.json", json{{"backends", {a_backend}}, {"log_level", "loud"}});
  CHECK(error_of({"--config", file}) == "invalid --log-level 'loud' (from key 'log_level' in config file '" + file +
                                            "'): expected trace, debug, info, warn, error, critical or off");

  const std::string negative = dir.write_json("negative.json", json{{"backends", {a_backend}}, {"threads", -2}});
  CHECK_THAT(error_of({"--config", negative}), Catch::StartsWith("invalid --threads '-2' (from key 'threads'"));

  const std::string fraction = dir.write("fraction.json", R"({"backends": ["http://a:1"], "client_idle_timeout_ms": 1.5})");
  CHECK_THAT(error_of({"--config", fraction}), Catch::StartsWith("invalid --client-idle-timeout-ms '1.5' (from key"));

  const std::string dup = dir.write_json("dup.json", json{{"backends", {"http://a:1", "http://a:1/"}}});
  CHECK_THAT(error_of({"--config", dup}), Catch::StartsWith("duplicate --backend 'http://a:1/' (from key 'backends'"));
}

TEST_CASE("values of the wrong JSON type are refused, naming the key", "[config]") {
  temp_dir dir;
  const std::vector<std::pair<json, std::string>> cases{
      {json{{"threads", "4"}}, "key 'threads' in config file '%' must be a number, not string"},
      {json{{"threads", true}}, "key 'threads' in config file '%' must be a number, not boolean"},
      {json{{"policy", 1}}, "key 'policy' in config file '%' must be a string, not number"},
      {json{{"listen", nullptr}}, "key 'listen' in config file '%' must be a string, not null"},
      {json{{"backends", {{"url", "http://a:1"}}}}, "key 'backends' in config file '%' must be an array of URL strings, not object"},
      {json{{"backends", {1, 2}}}, "key 'backends' in config file '%' must be an array of URL strings, not array"},
  };
  int n = 0;
  for (const auto& [doc, message] : cases) {
    INFO(doc.dump());
    json full = doc;
    if (!full.contains("backends")) full["backends"] = {a_backend};
    const std::string file = dir.write_json("case" + std::to_string(n++) + ".json", full);
    std::string expected = message;
    expected.replace(expected.find('%'), 1, file);
    CHECK(error_of({"--config", file}) == expected);
  }
}

TEST_CASE("unknown config keys are errors that name the key", "[config]") {
  temp_dir dir;
  SECTION("a typo gets a suggestion") {
    const std::string file = dir.write_json("dplb.json", json{{"backends", {a_backend}}, {"polcy", "round-robin"}});
    CHECK(error_of({"--config", file}) ==
          "unknown key 'polcy' in config file '" + file + "' (did you mean 'policy'?)");
  }
  SECTION("a flag spelling gets a suggestion of the snake_case key") {
    const std::string file = dir.write_json("dplb.json", json{{"backends", {a_backend}}, {"log-level", "debug"}});
    CHECK_THAT(error_of({"--config", file}), Catch::Contains("unknown key 'log-level'") &&
                                                 Catch::Contains("did you mean 'log_level'?"));
  }
  SECTION("something unrelated lists the known keys") {
    const std::string file = dir.write_json("dplb.json", json{{"backends", {a_backend}}, {"tls_certificate", "x.pem"}});
    const std::string msg = error_of({"--config", file});
    CHECK_THAT(msg, Catch::StartsWith("unknown key 'tls_certificate' in config file '" + file + "'; known keys: "));
    CHECK_THAT(msg, Catch::Contains("listen, backends, prefill, decode, policy, prefill_policy, pd_skip_prefill_ratio, stats_interval, kv_pressure_weight, default_max_tokens, load_bound, prefix_min_match, prefix_index_blocks, block_size, kv_index_blocks, tokenize, affinity_header, slow_start, threads, log_level, log_format"));
    CHECK_THAT(msg, Catch::Contains("upstream_max_idle_per_rank"));
  }
  SECTION("the file cannot name another config file") {
    const std::string file = dir.write_json("dplb.json", json{{"backends", {a_backend}}, {"config", "other.json"}});
    CHECK_THAT(error_of({"--config", file}), Catch::StartsWith("unknown key 'config' in config file"));
  }
  SECTION("an unknown key is an error even when every value is overridden") {
    const std::string file = dir.write_json("dplb.json", json{{"bakends", {a_backend}}});
    CHECK_THAT(error_of({"--config", file, "--backend", a_backend}), Catch::StartsWith("unknown key 'bakends'"));
  }
}

TEST_CASE("a key given twice in the config file is an error", "[config]") {
  temp_dir dir;
  const std::string file =
      dir.write("dplb.json", std::string(R"({"backends": ["http://a:1"], "threads": 2, "threads": 4})"));
  CHECK(error_of({"--config", file}) == "key 'threads' appears twice in config file '" + file + "'");
  // Only keys are checked: an array's entries are values (a key repeated inside a cluster's object is refused
  // too, see settings_clusters_test.cpp).
  const std::string ok = dir.write("ok.json", std::string(R"({"backends": ["http://a:1", "http://b:2"]})"));
  CHECK(run({"--config", ok}).backends.size() == 2);
}

TEST_CASE("an unreadable or malformed config file is a clear error", "[config]") {
  temp_dir dir;
  SECTION("missing") {
    const std::string missing = (dir.path() / "nope.json").string();
    CHECK(error_of({"--config", missing, "--backend", a_backend}) ==
          "cannot read config file '" + missing + "': No such file or directory");
    CHECK_THAT(error_of({"--backend", a_backend}, {{"DPLB_CONFIG", missing}}),
               Catch::StartsWith("cannot read config file '" + missing + "'"));
  }
  SECTION("a directory") {
    CHECK(error_of({"--config", dir.path().string()}) ==
          "cannot read config file '" + dir.path().string() + "': it is a directory");
  }
  SECTION("invalid JSON") {
    const std::string file = dir.write("bad.json", std::string("{\"backends\": [\"http://a:1\"],\n \"threads\": }"));
    const std::string msg = error_of({"--config", file});
    CHECK_THAT(msg, Catch::StartsWith("invalid JSON in config file '" + file + "': "));
    CHECK_THAT(msg, Catch::Contains("line 2"));
    CHECK_THAT(msg, !Catch::Contains("json.exception"));
  }
  SECTION("empty") {
    CHECK_THAT(error_of({"--config", dir.write("empty.json", std::string())}),
               Catch::StartsWith("invalid JSON in config file"));
  }
  SECTION("not an object") {
    const std::string file = dir.write_json("array.json", json::array({a_backend}));
    CHECK_THAT(error_of({"--config", file}), Catch::StartsWith("config file '" + file + "' must hold a JSON object"));
  }
  SECTION("empty --config") {
    CHECK(error_of({"--config", "", "--backend", a_backend}) == "invalid --config '': expected a file path");
  }
}

TEST_CASE("an empty backends list in the file counts as none", "[config]") {
  temp_dir dir;
  const std::string file = dir.write_json("dplb.json", json{{"backends", json::array()}});
  CHECK(error_of({"--config", file}) ==
        "no backend given: pass --backend http://HOST:PORT (repeatable) or set DPLB_BACKENDS (or --prefill and --decode for disaggregated serving)");
  CHECK(urls_of(run({"--config", file}, {{"DPLB_BACKENDS", a_backend}}).backends) == std::vector<std::string>{a_backend});
}

TEST_CASE("the shipped example config file is valid and complete", "[config]") {
  const std::filesystem::path example = source_root() / "config" / "dplb.example.json";
  INFO(example.string());
  REQUIRE(std::filesystem::exists(example));
  const auto s = run({"--config", example.string()});
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://127.0.0.1:8100", "http://127.0.0.1:8101",
                                               "http://127.0.0.1:8102", "http://127.0.0.1:8103"});
  // Complete: one key per option that a file can set.
  std::ifstream in(example);
  const json doc = json::parse(in);
  for (const auto& c : every_option()) {
    INFO(config_key(c.flag));
    CHECK(doc.contains(config_key(c.flag)));
  }
  CHECK(doc.size() == every_option().size());
  // docs/configuration.md shows this file whole and calls it complete: the two must not drift apart.
  const auto text_of = [](const std::filesystem::path& path) {
    std::ifstream file(path);
    return std::string(std::istreambuf_iterator<char>(file), {});
  };
  CHECK_THAT(text_of(source_root() / "docs" / "configuration.md"), Catch::Contains(text_of(example)));
}

// --- the admin API's options: --admin-listen, --admin-token-file, and the token itself in DPLB_ADMIN_TOKEN ---

TEST_CASE("no admin API by default, and no token needed then", "[config][admin]") {
  const auto s = run({"--backend", a_backend});
  CHECK_FALSE(s.admin_listen.has_value());
  CHECK_FALSE(s.admin_token_file.has_value());
  CHECK(s.admin_token.empty());
}

TEST_CASE("the admin options are read from each source, under the naming rule", "[config][admin]") {
  temp_dir dir;
  const std::string token_file = dir.write("token", "from-file");
  const std::vector<std::string> base{"--backend", a_backend};
  const auto check_admin = [&](const cfg::settings& s) {
    REQUIRE(s.admin_listen.has_value());
    CHECK(s.admin_listen->host == "127.0.0.3");
    CHECK(s.admin_listen->port == 9100);
    CHECK(s.admin_token_file == token_file);
    CHECK(s.admin_token == "from-file");
  };
  auto cli = base;
  cli.insert(cli.end(), {"--admin-listen", "127.0.0.3:9100", "--admin-token-file", token_file});
  check_admin(run(cli));
  check_admin(run(base, {{env_name("admin-listen"), "127.0.0.3:9100"}, {env_name("admin-token-file"), token_file}}));
  const std::string file = dir.write_json(
      "dplb.json", json{{config_key("admin-listen"), "127.0.0.3:9100"}, {config_key("admin-token-file"), token_file}});
  auto with_file = base;
  with_file.insert(with_file.end(), {"--config", file});
  check_admin(run(with_file));
}

TEST_CASE("the admin token comes from DPLB_ADMIN_TOKEN or a file, trimmed of surrounding whitespace", "[config][admin]") {
  temp_dir dir;
  const std::vector<std::string> args{"--backend", a_backend, "--admin-listen", "127.0.0.1:0"};
  CHECK(run(args, {{"DPLB_ADMIN_TOKEN", "  tok en\t\n"}}).admin_token == "tok en");
  auto with_file = args;
  with_file.insert(with_file.end(), {"--admin-token-file", dir.write("token", "\n  abc123 \r\n")});
  CHECK(run(with_file).admin_token == "abc123");
  // A token without a listener is harmless: it is read, and unused.
  CHECK(run({"--backend", a_backend}, {{"DPLB_ADMIN_TOKEN", "t"}}).admin_token == "t");
}

TEST_CASE("an admin listener without a token is refused, saying how to give one", "[config][admin]") {
  const auto message = error_of({"--backend", a_backend, "--admin-listen", "127.0.0.1:9100"});
  CHECK_THAT(message, Catch::Contains("--admin-listen needs a token"));
  CHECK_THAT(message, Catch::Contains("--admin-token-file"));
  CHECK_THAT(message, Catch::Contains("DPLB_ADMIN_TOKEN"));
  // An empty variable counts as unset, like every DPLB_* variable.
  CHECK_THAT(error_of({"--backend", a_backend}, {{"DPLB_ADMIN_LISTEN", "127.0.0.1:0"}, {"DPLB_ADMIN_TOKEN", ""}}),
             Catch::Contains("--admin-listen needs a token"));
}

TEST_CASE("an empty, unreadable or doubly given admin token is refused without showing it", "[config][admin]") {
  temp_dir dir;
  const std::vector<std::string> args{"--backend", a_backend, "--admin-listen", "127.0.0.1:0"};
  const auto with_file = [&](const std::string& path) {
    auto a = args;
    a.insert(a.end(), {"--admin-token-file", path});
    return a;
  };
  const std::string blank = dir.write("blank", " \n\t\n");
  CHECK(error_of(with_file(blank)) == "admin token file '" + blank + "' is empty; put the token in it");
  CHECK(error_of(args, {{"DPLB_ADMIN_TOKEN", "  \n"}}) == "DPLB_ADMIN_TOKEN holds only whitespace; set a token");
  const std::string missing = (dir.path() / "missing").string();
  CHECK_THAT(error_of(with_file(missing)), Catch::StartsWith("cannot read admin token file '" + missing + "': "));
  CHECK_THAT(error_of(with_file(dir.path().string())), Catch::EndsWith("it is a directory"));
  const std::string good = dir.write("token", "secret-in-file");
  const auto twice = error_of(with_file(good), {{"DPLB_ADMIN_TOKEN", "secret-in-env"}});
  CHECK_THAT(twice, Catch::Contains("given twice"));
  CHECK_THAT(twice, Catch::Contains("give one"));
  CHECK_THAT(twice, !Catch::Contains("secret"));
  CHECK_THAT(error_of({"--backend", a_backend, "--admin-listen", "9100"}, {{"DPLB_ADMIN_TOKEN", "t"}}),
             Catch::StartsWith("invalid --admin-listen '9100': expected HOST:PORT"));
  CHECK(error_of({"--backend", a_backend, "--admin-token-file="}) ==
        "option '--admin-token-file' needs a value after '='; see 'dplb --help'");
}
