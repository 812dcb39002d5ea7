// Which tenant a request is from: a known Bearer key first, then a header naming a configured tenant, else
// "default"; what a configuration must fix, each rule on its own; and no key kept or shown as text.
#include <catch2/catch.hpp>

#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "dplb/tenants/tenant_directory.hpp"

using namespace dplb::tenants;

namespace {

// SHA-256("abc"), FIPS 180-2's first example.
constexpr const char* abc_sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

tenant_directory directory(const std::vector<tenant_spec>& specs) { return tenant_directory(specs); }

// acme: a plain key; globex: a key by digest ("abc"); initech: no key.
tenant_directory three_tenants() {
  return directory({{.name = "acme", .weight = 3, .api_keys = {"acme-key-1", "acme-key-2"}},
                    {.name = "globex", .api_key_sha256 = {abc_sha256}},
                    {.name = "initech"}});
}

std::string error_of(const std::vector<tenant_spec>& specs) {
  try {
    directory(specs);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("tenant directory: the default tenant is index 0, the others follow in their order", "[tenants]") {
  const auto dir = three_tenants();
  REQUIRE(dir.tenants().size() == 4u);
  CHECK(dir.tenants()[0].name == "default");
  CHECK(dir.tenants()[0].weight == 1u);
  CHECK(dir.tenants()[1].name == "acme");
  CHECK(dir.tenants()[1].weight == 3u);
  CHECK(dir.tenants()[2].name == "globex");
  CHECK(dir.tenants()[3].name == "initech");
  CHECK(dir.tenant_named("initech") == 3u);
  CHECK(dir.tenant_named("default") == 0u);
  CHECK_FALSE(dir.tenant_named("Acme"));  // case-sensitive
  CHECK(directory({}).tenants().size() == 1u);
}

TEST_CASE("tenant directory: a spec named default configures index 0, wherever it is listed", "[tenants]") {
  const auto dir = directory({{.name = "acme"},
                              {.name = "default", .weight = 2, .api_keys = {"fallback-key"},
                               .requests_per_second = 5.0, .burst = 10, .max_queued = 100}});
  REQUIRE(dir.tenants().size() == 2u);
  const auto& fallback = dir.tenants()[0];
  CHECK(fallback.name == "default");
  CHECK(fallback.weight == 2u);
  CHECK(fallback.requests_per_second == 5.0);
  CHECK(fallback.burst == 10u);
  CHECK(fallback.max_queued == 100u);
  CHECK(dir.tenants()[1].name == "acme");
  CHECK_FALSE(dir.tenants()[1].requests_per_second);
  CHECK_FALSE(dir.tenants()[1].tokens_per_minute);
  CHECK_FALSE(dir.tenants()[1].max_queue_wait);
  CHECK(dir.tenant_of("Bearer fallback-key", "acme") == 0u);
}

TEST_CASE("tenant directory: a known Bearer key decides, given as the key or as its digest", "[tenants]") {
  const auto dir = three_tenants();
  CHECK(dir.tenant_of("Bearer acme-key-1", "") == 1u);
  CHECK(dir.tenant_of("Bearer acme-key-2", "") == 1u);
  CHECK(dir.tenant_of("Bearer abc", "") == 2u);
  CHECK(dir.has_known_key("Bearer acme-key-1"));
  CHECK(dir.has_known_key("Bearer abc"));
}

TEST_CASE("tenant directory: the scheme in any case, one space or more, trailing blanks ignored", "[tenants]") {
  const auto dir = three_tenants();
  CHECK(dir.tenant_of("bearer acme-key-1", "") == 1u);
  CHECK(dir.tenant_of("BEARER acme-key-1", "") == 1u);
  CHECK(dir.tenant_of("Bearer    acme-key-1", "") == 1u);
  CHECK(dir.tenant_of("Bearer acme-key-1 \t", "") == 1u);
  CHECK_FALSE(dir.has_known_key("Bearer ACME-KEY-1"));  // the key itself is case-sensitive
  CHECK_FALSE(dir.has_known_key("Beareracme-key-1"));
  CHECK_FALSE(dir.has_known_key("Bearer\tacme-key-1"));
  CHECK_FALSE(dir.has_known_key("Bearer "));
  CHECK_FALSE(dir.has_known_key("Bearer"));
  CHECK_FALSE(dir.has_known_key(""));
}

TEST_CASE("tenant directory: the key wins over a header naming another tenant", "[tenants]") {
  const auto dir = three_tenants();
  CHECK(dir.tenant_of("Bearer acme-key-1", "initech") == 1u);
  CHECK(dir.tenant_of("Bearer abc", "acme") == 2u);
  CHECK(dir.tenant_of("Bearer abc", "default") == 2u);
}

TEST_CASE("tenant directory: without a known key, the header's tenant if configured, else default",
          "[tenants]") {
  const auto dir = three_tenants();
  CHECK(dir.tenant_of("", "initech") == 3u);
  CHECK(dir.tenant_of("Bearer unknown-key", "initech") == 3u);
  CHECK_FALSE(dir.has_known_key("Bearer unknown-key"));
  CHECK(dir.tenant_of("", "umbrella") == 0u);  // names no configured tenant
  CHECK(dir.tenant_of("", "INITECH") == 0u);
  CHECK(dir.tenant_of("", "") == 0u);
  CHECK(dir.tenant_of("Bearer unknown-key", "") == 0u);
}

TEST_CASE("tenant directory: a header never selects a tenant that holds keys: without its key, default",
          "[tenants]") {
  const auto dir = three_tenants();
  CHECK(dir.tenant_of("", "acme") == 0u);        // plain keys
  CHECK(dir.tenant_of("", "globex") == 0u);      // a key by digest
  CHECK(dir.tenant_of("Bearer wrong", "acme") == 0u);
  CHECK(dir.tenant_of("Basic acme-key-1", "acme") == 0u);
  CHECK_FALSE(dir.tenant_by_header("acme"));
  CHECK_FALSE(dir.tenant_by_header("globex"));
  CHECK(dir.tenant_by_header("initech") == 3u);
  CHECK(dir.tenants()[1].holds_keys);
  CHECK(dir.tenants()[2].holds_keys);
  CHECK_FALSE(dir.tenants()[3].holds_keys);
  // The key itself still selects it, whatever the header says.
  CHECK(dir.tenant_of("Bearer acme-key-1", "acme") == 1u);
  // A default tenant with a key is default without it too.
  const auto keyed_default = directory({{.name = "default", .api_keys = {"d-key"}}, {.name = "acme"}});
  CHECK(keyed_default.tenant_of("", "default") == 0u);
  CHECK(keyed_default.tenant_of("", "acme") == 1u);
}

TEST_CASE("tenant directory: an Authorization that is not Bearer carries no key", "[tenants]") {
  const auto dir = three_tenants();
  // "Basic" with the key itself as credentials, and the key alone: neither is `Bearer KEY`.
  CHECK(dir.tenant_of("Basic acme-key-1", "initech") == 3u);
  CHECK(dir.tenant_of("acme-key-1", "") == 0u);
  CHECK_FALSE(dir.has_known_key("Basic acme-key-1"));
  CHECK_FALSE(dir.has_known_key("Token acme-key-1"));
}

TEST_CASE("tenant directory: without keys configured, only the header decides", "[tenants]") {
  const auto dir = directory({{.name = "acme"}});
  CHECK(dir.tenant_of("Bearer anything", "acme") == 1u);
  CHECK(dir.tenant_of("Bearer anything", "") == 0u);
  CHECK_FALSE(dir.has_known_key("Bearer anything"));
}

TEST_CASE("tenant directory: a name outside A-Z a-z 0-9 . _ - or 1 to 64 characters is refused", "[tenants]") {
  const std::vector<std::string> names = {"", "a b", "acme/eu", "acme\"", "caf\xc3\xa9", "a{b}", std::string(65, 'a')};
  for (const std::string& bad : names) {
    INFO("name '" << bad << "'");
    CHECK_THAT(error_of({{.name = bad}}), Catch::Contains("1 to 64 of A-Z a-z 0-9 . _ -"));
  }
  const auto dir = directory({{.name = "Team_A.eu-1"}, {.name = std::string(64, 'z')}});
  CHECK(dir.tenants().size() == 3u);
}

TEST_CASE("tenant directory: a tenant configured twice is refused, default included", "[tenants]") {
  CHECK_THAT(error_of({{.name = "acme"}, {.name = "globex"}, {.name = "acme"}}),
             Catch::Contains("tenant 'acme' is configured twice"));
  CHECK_THAT(error_of({{.name = "default"}, {.name = "default"}}),
             Catch::Contains("tenant 'default' is configured twice"));
}

TEST_CASE("tenant directory: a weight of 0 is refused", "[tenants]") {
  CHECK_THAT(error_of({{.name = "acme", .weight = 0}}), Catch::Contains("tenant 'acme': weight 0"));
  CHECK_THAT(error_of({{.name = "default", .weight = 0}}), Catch::Contains("tenant 'default': weight 0"));
}

TEST_CASE("tenant directory: every limit is kept as configured", "[tenants]") {
  const auto dir = directory({{.name = "batch", .requests_per_second = 0.5, .burst = 1, .max_queued = 0,
                               .tokens_per_minute = 120'000.0, .max_queue_wait = std::chrono::milliseconds(1)}});
  REQUIRE(dir.tenants().size() == 2u);
  const auto& batch = dir.tenants()[1];
  CHECK(batch.requests_per_second == 0.5);
  CHECK(batch.burst == 1u);
  CHECK(batch.max_queued == 0u);  // 0 is a limit: the tenant's requests never wait
  CHECK(batch.tokens_per_minute == 120'000.0);
  CHECK(batch.max_queue_wait == std::chrono::milliseconds(1));
}

TEST_CASE("tenant directory: a rate that is not a finite number above 0 is refused", "[tenants]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double infinity = std::numeric_limits<double>::infinity();
  for (const double bad : {0.0, -1.0, nan, infinity}) {
    INFO("rate " << bad);
    CHECK_THAT(error_of({{.name = "acme", .requests_per_second = bad}}),
               Catch::Contains("tenant 'acme': requests_per_second") &&
                   Catch::Contains("a rate is a finite number above 0"));
    CHECK_THAT(error_of({{.name = "acme", .tokens_per_minute = bad}}),
               Catch::Contains("tenant 'acme': tokens_per_minute") &&
                   Catch::Contains("a rate is a finite number above 0"));
  }
  CHECK(error_of({{.name = "acme", .requests_per_second = 1e-3, .tokens_per_minute = 1e-3}}) == "no error");
}

TEST_CASE("tenant directory: a burst of 0 is refused", "[tenants]") {
  CHECK_THAT(error_of({{.name = "acme", .requests_per_second = 5.0, .burst = 0}}),
             Catch::Contains("tenant 'acme': burst 0; a burst is at least 1"));
}

TEST_CASE("tenant directory: a queue wait under 1 ms is refused", "[tenants]") {
  for (const auto bad : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5)}) {
    INFO("wait " << bad.count() << " ms");
    CHECK_THAT(error_of({{.name = "default", .max_queue_wait = bad}}),
               Catch::Contains("tenant 'default': max_queue_wait") &&
                   Catch::Contains("a wait is at least 1 ms"));
  }
}

TEST_CASE("tenant directory: a digest that is not 64 lowercase hex digits is refused, and not quoted",
          "[tenants]") {
  const std::string upper = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
  const std::string short_by_one = std::string(abc_sha256).substr(1);
  const std::string not_hex = "g" + short_by_one;
  const std::string pasted_key = "sk-live-pasted-in-the-wrong-field";
  for (const std::string& bad : {upper, short_by_one, not_hex, std::string(abc_sha256) + "0", pasted_key}) {
    INFO("digest '" << bad << "'");
    const auto message = error_of({{.name = "acme", .api_key_sha256 = {abc_sha256, bad}}});
    CHECK_THAT(message, Catch::Contains("tenant 'acme': api_key_sha256 #2 is not 64 lowercase hex digits"));
    CHECK_THAT(message, !Catch::Contains(bad));
  }
}

TEST_CASE("tenant directory: a plain key no header could carry is refused", "[tenants]") {
  for (const std::string bad : {"", " lead", "trail ", "tab\t"}) {
    INFO("key '" << bad << "'");
    CHECK_THAT(error_of({{.name = "acme", .api_keys = {"fine", bad}}}),
               Catch::Contains("tenant 'acme': api_keys #2 is empty or begins or ends with a blank"));
  }
}

TEST_CASE("tenant directory: a key listed twice is refused, in one tenant or two, plain or by digest",
          "[tenants]") {
  CHECK_THAT(error_of({{.name = "acme", .api_keys = {"k1", "k2", "k1"}}}),
             Catch::Contains("tenant 'acme' lists one key twice (api_keys #1 and api_keys #3)"));
  CHECK_THAT(error_of({{.name = "acme", .api_keys = {"abc"}, .api_key_sha256 = {abc_sha256}}}),
             Catch::Contains("tenant 'acme' lists one key twice (api_keys #1 and api_key_sha256 #1)"));
  CHECK_THAT(error_of({{.name = "acme", .api_key_sha256 = {abc_sha256, abc_sha256}}}),
             Catch::Contains("lists one key twice (api_key_sha256 #1 and api_key_sha256 #2)"));
  CHECK_THAT(error_of({{.name = "acme", .api_keys = {"k1"}}, {.name = "globex", .api_keys = {"k0", "k1"}}}),
             Catch::Contains("tenants 'acme' and 'globex' share a key (api_keys #1 of the one, api_keys #2 of the "
                             "other)"));
  CHECK_THAT(error_of({{.name = "acme", .api_key_sha256 = {abc_sha256}}, {.name = "default", .api_keys = {"abc"}}}),
             Catch::Contains("tenants 'acme' and 'default' share a key"));
}

TEST_CASE("tenant directory: no plain key is kept or shown", "[tenants]") {
  const std::string key = "sk-tenant-secret-7f3a9c";
  const auto dir = directory({{.name = "acme", .api_keys = {key}}});
  REQUIRE(dir.tenant_of("Bearer " + key, "") == 1u);
  for (const auto& t : dir.tenants()) CHECK_THAT(t.name, !Catch::Contains(key));
  // Nor in the message about a duplicate, which names the key by its place.
  const auto twice = error_of({{.name = "acme", .api_keys = {key}}, {.name = "globex", .api_keys = {key}}});
  CHECK_THAT(twice, Catch::Contains("share a key") && !Catch::Contains(key));
  const auto same_tenant = error_of({{.name = "acme", .api_keys = {key, key}}});
  CHECK_THAT(same_tenant, Catch::Contains("lists one key twice") && !Catch::Contains(key));
}
