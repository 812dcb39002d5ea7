// Tenants: the config file's "tenants" (each with its keys, weight and limits), the options around them
// (--require-api-key, --tenant-header, --fair-by, --max-queue-wait-ms) from each source, and every rule a
// tenant list must follow. No message about a tenant may show a key: each test that can see one looks.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dplb/config/settings.hpp"
#include "parse_helpers.hpp"

namespace cfg = dplb::config;
using json = nlohmann::json;
using std::chrono::milliseconds;

namespace {

using cfg::test::error_of;
using cfg::test::parse;
using cfg::test::run;
using cfg::test::source_root;
using cfg::test::temp_dir;

const std::string a_backend = "http://127.0.0.1:8100";
// A key as a client would send it, and its SHA-256 (printf %s "$KEY" | sha256sum).
const std::string a_key = "sk-team-a-3f9c2e7b1d";
const std::string digest_of_abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

// A config file with one backend, these tenants and the other keys of `rest`, in a directory of its own.
class tenants_file : public cfg::test::json_config_file {
 public:
  explicit tenants_file(const json& tenants, json rest = json::object())
      : json_config_file(with_tenants(tenants, std::move(rest))) {}

 private:
  static json with_tenants(const json& tenants, json rest) {
    rest["backends"] = {a_backend};
    rest["tenants"] = tenants;
    return rest;
  }
};

json keyed_tenant() { return {{"name", "team-a"}, {"api_keys", {a_key}}}; }

std::string text_of(const std::filesystem::path& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

}  // namespace

TEST_CASE("tenants: a full list is read with every field of every tenant", "[config][tenants]") {
  const tenants_file file(json::array({
      {{"name", "interactive"}, {"api_keys", {a_key, "sk-second"}}, {"api_key_sha256", {digest_of_abc}}, {"weight", 3},
       {"max_queued", 0}, {"max_queue_wait_ms", 2000}},
      {{"name", "batch"}, {"weight", 1}, {"requests_per_second", 2.5}, {"burst", 5}, {"max_queued", 100},
       {"tokens_per_minute", 120000}, {"min_priority", 10}},
      {{"name", "default"}, {"requests_per_second", 1}},
  }));
  const auto s = file.run();
  REQUIRE(s.tenants.size() == 3);
  const auto& interactive = s.tenants[0];
  CHECK(interactive.name == "interactive");
  CHECK(interactive.api_keys == std::vector<std::string>{a_key, "sk-second"});
  CHECK(interactive.api_key_sha256 == std::vector<std::string>{digest_of_abc});
  CHECK(interactive.weight == 3);
  CHECK(interactive.max_queued == 0u);
  CHECK(interactive.max_queue_wait == milliseconds(2000));
  CHECK_FALSE(interactive.requests_per_second);
  CHECK_FALSE(interactive.tokens_per_minute);

  const auto& batch = s.tenants[1];
  CHECK(batch.name == "batch");
  CHECK(batch.api_keys.empty());
  CHECK(batch.weight == 1);
  CHECK(batch.requests_per_second == 2.5);
  CHECK(batch.burst == 5u);
  CHECK(batch.max_queued == 100u);
  CHECK(batch.tokens_per_minute == 120000.0);
  CHECK_FALSE(batch.max_queue_wait);
  CHECK(batch.min_priority == 10);
  CHECK_FALSE(interactive.min_priority);

  CHECK(s.tenants[2].name == "default");
  CHECK(s.tenants[2].requests_per_second == 1.0);
}

TEST_CASE("tenants: without any, and for what a tenant leaves out, the defaults apply", "[config][tenants]") {
  const auto none = run({"--backend", a_backend});
  CHECK(none.tenants.empty());
  CHECK_FALSE(none.require_api_key);
  CHECK(none.tenant_header.empty());
  CHECK(none.fair_by == cfg::fair_basis::requests);
  CHECK(none.max_queue_wait == milliseconds(0));

  const auto named_only = tenants_file(json::array({{{"name", "team-a"}}})).run();
  REQUIRE(named_only.tenants.size() == 1);
  const auto& t = named_only.tenants[0];
  CHECK(t.weight == 1);
  CHECK(t.api_keys.empty());
  CHECK(t.api_key_sha256.empty());
  CHECK_FALSE(t.requests_per_second);
  CHECK_FALSE(t.burst);  // the token bucket's own default: ceil(requests_per_second), at least 1
  CHECK_FALSE(t.max_queued);
  CHECK_FALSE(t.tokens_per_minute);
  CHECK_FALSE(t.max_queue_wait);
  CHECK_FALSE(t.min_priority);

  CHECK(tenants_file(json::array()).run().tenants.empty());
}

TEST_CASE("tenants: each wrong value is refused, naming its place", "[config][tenants]") {
  const std::vector<std::pair<json, std::string>> cases{
      {json{{"weight", 0}}, "tenants[1].weight: must be an integer >= 1, not 0"},
      {json{{"weight", -2}}, "tenants[1].weight: must be an integer >= 1, not -2"},
      {json{{"weight", 1.5}}, "tenants[1].weight: must be an integer >= 1, not 1.5"},
      {json{{"weight", "3"}}, "tenants[1].weight: must be an integer >= 1, not string"},
      {json{{"weight", 1'000'001}}, "tenants[1].weight: must be an integer >= 1 and at most 1000000, not 1000001"},
      {json{{"requests_per_second", 0}}, "tenants[1].requests_per_second: must be a number > 0, not 0"},
      {json{{"requests_per_second", -1.5}}, "tenants[1].requests_per_second: must be a number > 0, not -1.5"},
      {json{{"requests_per_second", true}}, "tenants[1].requests_per_second: must be a number > 0, not boolean"},
      {json{{"requests_per_second", 2}, {"burst", 0}}, "tenants[1].burst: must be an integer >= 1, not 0"},
      {json{{"requests_per_second", 2}, {"burst", 2.5}}, "tenants[1].burst: must be an integer >= 1, not 2.5"},
      {json{{"burst", 4}}, "tenants[1].burst: needs requests_per_second"},
      {json{{"max_queued", -1}}, "tenants[1].max_queued: must be an integer >= 0, not -1"},
      {json{{"max_queued", nullptr}}, "tenants[1].max_queued: must be an integer >= 0, not null"},
      {json{{"tokens_per_minute", 0}}, "tenants[1].tokens_per_minute: must be a number > 0, not 0"},
      {json{{"tokens_per_minute", "lots"}}, "tenants[1].tokens_per_minute: must be a number > 0, not string"},
      {json{{"max_queue_wait_ms", 0}}, "tenants[1].max_queue_wait_ms: must be an integer >= 1, not 0"},
      {json{{"max_queue_wait_ms", "2s"}}, "tenants[1].max_queue_wait_ms: must be an integer >= 1, not string"},
      {json{{"max_queue_wait_ms", 86'400'001}},
       "tenants[1].max_queue_wait_ms: must be an integer >= 1 and at most 86400000, not 86400001"},
      {json{{"min_priority", 1.5}}, "tenants[1].min_priority: must be an integer (a 64-bit one), not 1.5"},
      {json{{"min_priority", "-1"}}, "tenants[1].min_priority: must be an integer (a 64-bit one), not string"},
      {json{{"min_priority", nullptr}}, "tenants[1].min_priority: must be an integer (a 64-bit one), not null"},
      {json{{"min_priority", 9'223'372'036'854'775'808ULL}},
       "tenants[1].min_priority: must be an integer (a 64-bit one), not 9223372036854775808"},
      {json{{"api_keys", a_key}}, "tenants[1].api_keys: must be an array of strings, not string"},
      {json{{"api_keys", {a_key, 7}}}, "tenants[1].api_keys[1]: must be a string, not number"},
      {json{{"api_key_sha256", {{{"hex", digest_of_abc}}}}}, "tenants[1].api_key_sha256[0]: must be a string, not object"},
  };
  for (const auto& [fields, message] : cases) {
    INFO(fields.dump());
    json second = fields;
    second["name"] = "team-b";
    const tenants_file file(json::array({{{"name", "team-a"}}, second}));
    const std::string error = file.error();
    CHECK(error.starts_with("config file '" + file.path() + "': "));
    CHECK_THAT(error, Catch::Contains(message));
    CHECK_THAT(error, !Catch::Contains(a_key));
  }
}

TEST_CASE("tenants: min_priority is any 64-bit integer, negative ones included", "[config][tenants]") {
  const auto s = tenants_file(json::array({{{"name", "a"}, {"min_priority", -5}},
                                           {{"name", "b"}, {"min_priority", 0}},
                                           {{"name", "c"}, {"min_priority", std::numeric_limits<std::int64_t>::min()}}}))
                     .run();
  REQUIRE(s.tenants.size() == 3);
  CHECK(s.tenants[0].min_priority == -5);
  CHECK(s.tenants[1].min_priority == 0);
  CHECK(s.tenants[2].min_priority == std::numeric_limits<std::int64_t>::min());
}

TEST_CASE("tenants: a number too large for a double is an invalid config file, not a crash", "[config][tenants]") {
  temp_dir dir;
  const std::string file = dir.write(
      "huge.json", R"({"backends": ["http://a:1"], "tenants": [{"name": "a", "requests_per_second": 1e400}]})");
  const std::string error = error_of({"--config", file});
  CHECK_THAT(error, Catch::StartsWith("invalid JSON in config file '" + file + "': ") &&
                        Catch::Contains("number overflow") && !Catch::Contains("json.exception"));
}

TEST_CASE("tenants: the list, each tenant and its name must have their JSON types", "[config][tenants]") {
  const tenants_file object(json{{"name", "team-a"}});
  CHECK(object.error() == "config file '" + object.path() + "': tenants: must be an array of tenant objects, not object");
  const tenants_file names_only(json::array({"team-a"}));
  CHECK_THAT(names_only.error(),
             Catch::StartsWith("config file '" + names_only.path() + "': tenants[0]: must be an object"));
  CHECK_THAT(tenants_file(json::array({{{"weight", 2}}})).error(), Catch::Contains("tenants[0].name: required"));
  CHECK_THAT(tenants_file(json::array({{{"name", 5}}})).error(),
             Catch::Contains("tenants[0].name: must be a string, not 5"));
}

TEST_CASE("tenants: unknown or repeated keys in a tenant are refused, naming the tenant's place", "[config][tenants]") {
  const tenants_file typo(json::array({{{"name", "team-a"}, {"wieght", 2}}}));
  CHECK(typo.error() == "unknown key 'wieght' in tenants[0] in config file '" + typo.path() + "' (did you mean 'weight'?)");
  const tenants_file unrelated(json::array({{{"name", "team-a"}, {"priority", 1}}}));
  CHECK_THAT(unrelated.error(), Catch::StartsWith("unknown key 'priority' in tenants[0]") &&
                                    Catch::Contains("known keys: name, api_keys, api_key_sha256, weight"));

  temp_dir dir;
  const std::string repeated = dir.write(
      "repeated.json",
      R"({"backends": ["http://a:1"], "tenants": [{"name": "a", "weight": 2, "weight": 3}]})");
  CHECK(error_of({"--config", repeated}) ==
        "key 'weight' appears twice in an object under 'tenants' in config file '" + repeated + "'");
  // "tenants" is a key of the file, suggested like the options' keys.
  const std::string near = dir.write_json("near.json", json{{"backends", {a_backend}}, {"tenant", json::array()}});
  CHECK_THAT(error_of({"--config", near}), Catch::Contains("(did you mean 'tenants'?)"));
}

TEST_CASE("tenants: what the tenant directory refuses stops the start with its message", "[config][tenants]") {
  const auto refused = [](const json& tenants) {
    const tenants_file file(tenants);
    const std::string error = file.error();
    CHECK_THAT(error, Catch::StartsWith("invalid \"tenants\" in config file '" + file.path() + "': "));
    return error;
  };
  // The name is not quoted: a key pasted into it must not reach the log.
  const auto bad_name = refused(json::array({{{"name", "team-a"}}, {{"name", "sk-live key"}}}));
  CHECK_THAT(bad_name, Catch::Contains("tenant #2's name is not 1 to 64 of A-Z a-z 0-9 . _ -"));
  CHECK_THAT(bad_name, !Catch::Contains("sk-live"));
  CHECK_THAT(refused(json::array({{{"name", ""}}})), Catch::Contains("tenant #1's name"));
  CHECK_THAT(refused(json::array({{{"name", "team-a"}}, {{"name", "team-a"}}})),
             Catch::Contains("tenant 'team-a' is configured twice"));
  CHECK_THAT(refused(json::array({keyed_tenant(), {{"name", "team-b"}, {"api_keys", {a_key}}}})),
             Catch::Contains("tenants 'team-a' and 'team-b' share a key (api_keys #1 of the one, api_keys #1 of the other)"));
  CHECK_THAT(refused(json::array({{{"name", "team-a"}, {"api_key_sha256", {"ABC"}}}})),
             Catch::Contains("tenant 'team-a': api_key_sha256 #1 is not 64 lowercase hex digits"));
  CHECK_THAT(refused(json::array({{{"name", "team-a"}, {"api_keys", {" padded"}}}})),
             Catch::Contains("tenant 'team-a': api_keys #1 is empty or begins or ends with a blank"));
  // A check --check-config makes too, since a run would fail on it.
  const tenants_file twice(json::array({{{"name", "team-a"}}, {{"name", "team-a"}}}));
  CHECK_THAT(twice.error({"--check-config"}), Catch::Contains("configured twice"));
}

TEST_CASE("tenants: no error message quotes a key", "[config][tenants]") {
  temp_dir dir;
  const std::string secret = "sk-live-0a1b2c3d4e5f";
  int n = 0;
  const auto error_for = [&](const std::string& text) {
    return error_of({"--config", dir.write("case" + std::to_string(n++) + ".json", text)});
  };
  const std::string backends = R"("backends": ["http://a:1"], )";
  const std::vector<std::string> files{
      // The same key twice, in one tenant or two.
      "{" + backends + R"("tenants": [{"name": "a", "api_keys": [")" + secret + R"(", ")" + secret + R"("]}]})",
      "{" + backends + R"("tenants": [{"name": "a", "api_keys": [")" + secret + R"("]}, {"name": "b", "api_keys": [")" +
          secret + R"("]}]})",
      // A key pasted where a digest belongs, and a key no header could carry.
      "{" + backends + R"("tenants": [{"name": "a", "api_key_sha256": [")" + secret + R"("]}]})",
      "{" + backends + R"("tenants": [{"name": "a", "api_keys": [")" + secret + R"( "]}]})",
      // A mistake next to a key, and a key in a file the JSON parser refuses inside the key itself.
      "{" + backends + R"("tenants": [{"name": "a", "api_keys": [")" + secret + R"("], "weight": 0}]})",
      "{" + backends + R"("tenants": [{"name": "a", "api_keys": [")" + secret + R"(\q"]}]})",
      "{" + backends + R"("tenants": [{"name": "a", "api_keys": [")" + secret + "\t" + R"("]}]})",
      // A mistake the directory finds before it reaches the keys.
      "{" + backends + R"("tenants": [{"name": "a b", "api_keys": [")" + secret + R"("]}]})",
  };
  for (const auto& text : files) {
    INFO(text);
    const std::string error = error_for(text);
    CHECK_FALSE(error.empty());
    CHECK_THAT(error, !Catch::Contains(secret) && !Catch::Contains(secret.substr(0, 8)));
  }
}

TEST_CASE("tenants: require_api_key from each source, command line over environment over file", "[config][tenants]") {
  const tenants_file with_key(json::array({keyed_tenant()}));
  CHECK(with_key.run({"--require-api-key"}).require_api_key);
  CHECK(with_key.run({}, {{"DPLB_REQUIRE_API_KEY", "true"}}).require_api_key);
  CHECK(with_key.run({}, {{"DPLB_REQUIRE_API_KEY", "1"}}).require_api_key);
  CHECK_FALSE(with_key.run({}, {{"DPLB_REQUIRE_API_KEY", "false"}}).require_api_key);
  CHECK_FALSE(with_key.run({}, {{"DPLB_REQUIRE_API_KEY", ""}}).require_api_key);  // empty: unset

  const tenants_file required(json::array({keyed_tenant()}), {{"require_api_key", true}});
  CHECK(required.run().require_api_key);
  CHECK_FALSE(required.run({}, {{"DPLB_REQUIRE_API_KEY", "no"}}).require_api_key);  // environment over file
  const tenants_file not_required(json::array({keyed_tenant()}), {{"require_api_key", false}});
  CHECK_FALSE(not_required.run().require_api_key);
  CHECK(not_required.run({}, {{"DPLB_REQUIRE_API_KEY", "yes"}}).require_api_key);
  CHECK(not_required.run({"--require-api-key"}, {{"DPLB_REQUIRE_API_KEY", "false"}}).require_api_key);

  CHECK(with_key.error({}, {{"DPLB_REQUIRE_API_KEY", "sometimes"}}) ==
        "invalid --require-api-key 'sometimes' (from DPLB_REQUIRE_API_KEY): expected true or false");
  const tenants_file as_text(json::array({keyed_tenant()}), {{"require_api_key", "true"}});
  CHECK(as_text.error() == "key 'require_api_key' in config file '" + as_text.path() + "' must be true or false, not string");
  // On the command line it is a flag: it takes no value.
  CHECK_THAT(with_key.error({"--require-api-key=true"}), Catch::Contains("takes no value"));
}

TEST_CASE("tenants: require_api_key with no tenant holding a key is refused, saying what to add", "[config][tenants]") {
  const std::string what_to_do = "but no tenant holds an API key, so every request would be refused with 401: add "
                                 "\"api_keys\" or \"api_key_sha256\" to a tenant";
  CHECK(error_of({"--backend", a_backend, "--require-api-key"}).starts_with("--require-api-key is given " + what_to_do));
  CHECK(error_of({"--backend", a_backend}, {{"DPLB_REQUIRE_API_KEY", "true"}})
            .starts_with("DPLB_REQUIRE_API_KEY is true " + what_to_do));
  const tenants_file keyless(json::array({{{"name", "team-a"}}, {{"name", "default"}, {"weight", 2}}}),
                             {{"require_api_key", true}});
  CHECK(keyless.error().starts_with("\"require_api_key\" is true in config file '" + keyless.path() + "' " + what_to_do));
  // One key anywhere is enough, as a digest or in the default tenant.
  CHECK(tenants_file(json::array({{{"name", "team-a"}, {"api_key_sha256", {digest_of_abc}}}}),
                     {{"require_api_key", true}})
            .run()
            .require_api_key);
  CHECK(tenants_file(json::array({{{"name", "default"}, {"api_keys", {a_key}}}}), {{"require_api_key", true}})
            .run()
            .require_api_key);
  // Not required, no key is fine.
  CHECK_FALSE(keyless.run({}, {{"DPLB_REQUIRE_API_KEY", "false"}}).require_api_key);
}

TEST_CASE("tenants: option --tenant-header from each source, command line over environment over file", "[config][tenants]") {
  const tenants_file file(json::array({keyed_tenant()}), {{"tenant_header", "x-from-file"}});
  CHECK(file.run().tenant_header == "x-from-file");
  CHECK(file.run({}, {{"DPLB_TENANT_HEADER", "x-from-env"}}).tenant_header == "x-from-env");
  CHECK(file.run({"--tenant-header", "X-Tenant"}, {{"DPLB_TENANT_HEADER", "x-from-env"}}).tenant_header == "X-Tenant");
  CHECK(run({"--backend", a_backend, "--tenant-header=x-team_id.v2"}).tenant_header == "x-team_id.v2");
}

TEST_CASE("tenants: a tenant header that is no header name, hop-by-hop or carries the request is refused",
          "[config][tenants]") {
  for (const std::string bad : {"x tenant", "x-tenant:", "x/tenant", "x\"tenant", "x-ten\xc3\xa4nt"}) {
    INFO(bad);
    CHECK_THAT(error_of({"--backend", a_backend, "--tenant-header", bad}),
               Catch::StartsWith("invalid --tenant-header '" + bad + "': expected a header name"));
  }
  CHECK_THAT(error_of({"--backend", a_backend}, {{"DPLB_TENANT_HEADER", " "}}),
             Catch::StartsWith("invalid --tenant-header ' ' (from DPLB_TENANT_HEADER): expected a header name"));
  for (const std::string hop : {"Connection", "keep-alive", "TE", "Upgrade", "Proxy-Authorization", "Proxy-Connection"}) {
    INFO(hop);
    CHECK_THAT(error_of({"--backend", a_backend, "--tenant-header", hop}), Catch::Contains("hop-by-hop"));
  }
  for (const std::string reserved : {"Authorization", "host", "Content-Length", "transfer-encoding"}) {
    INFO(reserved);
    CHECK_THAT(error_of({"--backend", a_backend, "--tenant-header", reserved}),
               Catch::StartsWith("invalid --tenant-header '" + reserved + "'") &&
                   Catch::Contains("use another, e.g. x-tenant"));
  }
  const tenants_file file(json::array(), {{"tenant_header", "authorization"}});
  CHECK_THAT(file.error(), Catch::StartsWith("invalid --tenant-header 'authorization' (from key 'tenant_header'"));
}

TEST_CASE("tenants: option --fair-by from each source, command line over environment over file", "[config][tenants]") {
  const tenants_file file(json::array(), {{"fair_by", "tokens"}});
  CHECK(file.run().fair_by == cfg::fair_basis::tokens);
  CHECK(file.run({}, {{"DPLB_FAIR_BY", "requests"}}).fair_by == cfg::fair_basis::requests);
  CHECK(file.run({"--fair-by", "tokens"}, {{"DPLB_FAIR_BY", "requests"}}).fair_by == cfg::fair_basis::tokens);
  CHECK(run({"--backend", a_backend}, {{"DPLB_FAIR_BY", "TOKENS"}}).fair_by == cfg::fair_basis::tokens);
  CHECK(error_of({"--backend", a_backend, "--fair-by", "bytes"}) == "invalid --fair-by 'bytes': expected requests or tokens");
}

TEST_CASE("tenants: option --max-queue-wait-ms from each source, command line over environment over file",
          "[config][tenants]") {
  const tenants_file file(json::array(), {{"max_queue_wait_ms", 5000}});
  CHECK(file.run().max_queue_wait == milliseconds(5000));
  CHECK(file.run({}, {{"DPLB_MAX_QUEUE_WAIT_MS", "2s"}}).max_queue_wait == milliseconds(2000));
  CHECK(file.run({"--max-queue-wait-ms", "0"}, {{"DPLB_MAX_QUEUE_WAIT_MS", "2s"}}).max_queue_wait == milliseconds(0));
  CHECK(run({"--backend", a_backend, "--max-queue-wait-ms", "86400000"}).max_queue_wait == milliseconds(86'400'000));
  CHECK(error_of({"--backend", a_backend, "--max-queue-wait-ms", "86400001"}) ==
        "invalid --max-queue-wait-ms '86400001': expected a whole number from 0 to 86400000 (ms), or a duration such "
        "as 250ms or 1.5s");
}

TEST_CASE("tenants: option --help explains each new option with its variable, key and default", "[config][tenants]") {
  const std::string help = cfg::help_text();
  for (const auto& [flag, env, key, default_value] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"require-api-key", "DPLB_REQUIRE_API_KEY", "require_api_key", "false"},
           {"tenant-header NAME", "DPLB_TENANT_HEADER", "tenant_header", "none"},
           {"fair-by requests|tokens", "DPLB_FAIR_BY", "fair_by", "requests"},
           {"max-queue-wait-ms MS", "DPLB_MAX_QUEUE_WAIT_MS", "max_queue_wait_ms", "0"},
       }) {
    INFO(flag);
    const auto at = help.find("--" + flag + " ");
    REQUIRE(at != std::string::npos);
    const std::string entry = help.substr(at, help.find("\n  --", at + 1) + 1 - at);  // with its last newline
    CHECK_THAT(entry, Catch::Contains("env " + env));
    CHECK_THAT(entry, Catch::Contains("config key \"" + key + "\""));
    CHECK_THAT(entry, Catch::Contains("default " + default_value + "\n"));
  }
  // The prose as one line: where --help wraps it depends on the words around.
  std::string prose;
  for (const char c : help) {
    const bool blank = c == ' ' || c == '\n';
    if (!blank || (!prose.empty() && prose.back() != ' ')) prose += blank ? ' ' : c;
  }
  CHECK_THAT(prose, Catch::Contains("Refuse with 401"));
  CHECK_THAT(prose, Catch::Contains("answered 429 with Retry-After"));
  CHECK_THAT(prose, Catch::Contains("\"tenants\": [{\"name\", \"api_keys\", \"api_key_sha256\", \"weight\""));
}

TEST_CASE("tenants: option --check-config names the tenants and whether a key is required", "[config][tenants]") {
  const tenants_file file(json::array({keyed_tenant(), {{"name", "default"}, {"weight", 2}}}),
                          {{"require_api_key", true}});
  const auto checked = parse({"--check-config", "--config", file.path()});
  CHECK_THAT(checked.print_and_exit, Catch::Contains("  tenants default, team-a; an API key is required\n"));
  CHECK_THAT(parse({"--check-config", "--backend", a_backend}).print_and_exit, !Catch::Contains("tenants"));
}

TEST_CASE("tenants: the worked example of docs/configuration.md is a valid configuration", "[config][tenants]") {
  // The example is the first JSON block after its heading; it must parse as shown.
  const std::string doc = text_of(source_root() / "docs" / "configuration.md");
  const auto heading = doc.find("### Example: an interactive team and a batch team");
  REQUIRE(heading != std::string::npos);
  const auto start = doc.find("```json\n", heading);
  REQUIRE(start != std::string::npos);
  const auto body = start + std::string("```json\n").size();
  const std::string example = doc.substr(body, doc.find("```", body) - body);
  temp_dir dir;
  const auto s = run({"--config", dir.write("example.json", example)});
  REQUIRE(s.tenants.size() == 2);
  CHECK(s.tenants[0].name == "interactive");
  CHECK(s.tenants[0].weight == 3);
  CHECK(s.tenants[0].api_key_sha256.size() == 1);
  CHECK(s.tenants[1].name == "batch");
  CHECK(s.tenants[1].weight == 1);
  CHECK(s.tenants[1].requests_per_second.has_value());
  CHECK(s.tenants[1].tokens_per_minute.has_value());
  CHECK(s.require_api_key);
}
