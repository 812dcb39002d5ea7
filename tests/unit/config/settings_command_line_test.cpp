// Command-line parsing and validation of dplb's settings: forms of each option, every validation error, --help
// and --version. Precedence between sources and the config file are in settings_sources_test.cpp.

#include <catch2/catch.hpp>

#include <spdlog/common.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "dplb/config/settings.hpp"
#include "parse_helpers.hpp"

namespace cfg = dplb::config;

namespace {

using cfg::test::error_of;
using cfg::test::parse;
using cfg::test::run;
using cfg::test::urls_of;

const std::string one_backend = "--backend=http://127.0.0.1:8100";

}  // namespace

TEST_CASE("defaults apply when only a backend is given", "[config]") {
  const cfg::settings s = run({"--backend", "http://127.0.0.1:8100"});
  CHECK(s.listen.host == "0.0.0.0");
  CHECK(s.listen.port == 8000);
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://127.0.0.1:8100"});
  CHECK(s.policy == "least-inflight");
  CHECK_FALSE(s.stats_interval.has_value());  // 100 ms for a policy that reads engine stats
  CHECK(s.threads == 0);
  CHECK(s.log_level == "info");
  CHECK(s.log_fmt == cfg::log_format::text);
  CHECK(s.max_request_body_bytes == 64u * 1024 * 1024);
  CHECK(s.max_header_bytes == 64u * 1024);
  CHECK(s.client_idle_timeout == std::chrono::milliseconds(60'000));
  CHECK(s.request_read_timeout == std::chrono::milliseconds(30'000));
  CHECK(s.upstream_connect_timeout == std::chrono::milliseconds(5'000));
  CHECK(s.upstream_read_timeout == std::chrono::milliseconds(600'000));
  CHECK(s.client_write_timeout == std::chrono::milliseconds(60'000));
  CHECK(s.upstream_idle_timeout == std::chrono::milliseconds(4'000));
  CHECK(s.upstream_max_idle_per_rank == 256);
  CHECK_FALSE(s.config_file.has_value());
}

TEST_CASE("every option is read from the command line, in both --name value and --name=value form", "[config]") {
  const bool adjacent = GENERATE(false, true);
  const std::vector<std::pair<std::string, std::string>> options{
      {"listen", "127.0.0.1:9000"},
      {"backend", "http://10.0.0.1:8100"},
      {"policy", "round-robin"},
      {"stats-interval", "250"},
      {"threads", "8"},
      {"log-level", "debug"},
      {"log-format", "json"},
      {"max-request-body-bytes", "1048576"},
      {"max-header-bytes", "16384"},
      {"client-idle-timeout-ms", "1001"},
      {"request-read-timeout-ms", "1002"},
      {"upstream-connect-timeout-ms", "1003"},
      {"upstream-read-timeout-ms", "1004"},
      {"client-write-timeout-ms", "1005"},
      {"upstream-idle-timeout-ms", "1006"},
      {"upstream-max-idle-per-rank", "7"},
  };
  std::vector<std::string> args;
  for (const auto& [name, value] : options) {
    if (adjacent) {
      args.push_back("--" + name + "=" + value);
    } else {
      args.push_back("--" + name);
      args.push_back(value);
    }
  }
  const cfg::settings s = run(args);
  CHECK(s.listen.host == "127.0.0.1");
  CHECK(s.listen.port == 9000);
  CHECK(urls_of(s.backends) == std::vector<std::string>{"http://10.0.0.1:8100"});
  CHECK(s.policy == "round-robin");
  CHECK(s.stats_interval == std::chrono::milliseconds(250));
  CHECK(s.threads == 8);
  CHECK(s.log_level == "debug");
  CHECK(s.log_fmt == cfg::log_format::json);
  CHECK(s.max_request_body_bytes == 1048576);
  CHECK(s.max_header_bytes == 16384);
  CHECK(s.client_idle_timeout == std::chrono::milliseconds(1001));
  CHECK(s.request_read_timeout == std::chrono::milliseconds(1002));
  CHECK(s.upstream_connect_timeout == std::chrono::milliseconds(1003));
  CHECK(s.upstream_read_timeout == std::chrono::milliseconds(1004));
  CHECK(s.client_write_timeout == std::chrono::milliseconds(1005));
  CHECK(s.upstream_idle_timeout == std::chrono::milliseconds(1006));
  CHECK(s.upstream_max_idle_per_rank == 7);
}

TEST_CASE("option --backend is repeatable, takes comma-separated lists, and keeps rank order", "[config]") {
  SECTION("repeated") {
    const auto s = run({"--backend", "http://h:3", "--backend", "http://h:1", "--backend", "http://h:2"});
    CHECK(urls_of(s.backends) == std::vector<std::string>{"http://h:3", "http://h:1", "http://h:2"});
  }
  SECTION("comma-separated list and repetition mixed") {
    const auto s = run({"--backend", "http://a:1,http://b:2", "--backend", "http://c:3"});
    CHECK(urls_of(s.backends) == std::vector<std::string>{"http://a:1", "http://b:2", "http://c:3"});
  }
  SECTION("blanks around list entries are ignored") {
    const auto s = run({"--backend", " http://a:1 , http://b:2"});
    CHECK(urls_of(s.backends) == std::vector<std::string>{"http://a:1", "http://b:2"});
  }
}

TEST_CASE("backend URLs are normalised to http://host:port", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"http://127.0.0.1:8100", "http://127.0.0.1:8100"},
      {"http://127.0.0.1:8100/", "http://127.0.0.1:8100"},
      {"http://engine-0.local:8000", "http://engine-0.local:8000"},
      {"http://Engine-0.Local:8000/", "http://engine-0.local:8000"},
      {"HTTP://localhost:8000", "http://localhost:8000"},
      {"http://localhost", "http://localhost:80"},
      {"http://[::1]:8100", "http://[::1]:8100"},
      {"http://[0:0:0:0:0:0:0:1]:8100/", "http://[::1]:8100"},
      {"http://vllm_rank_0:8000", "http://vllm_rank_0:8000"},
      {"http://h:65535", "http://h:65535"},
  };
  for (const auto& [given, normal] : cases) {
    INFO(given);
    CHECK(urls_of(run({"--backend", given}).backends) == std::vector<std::string>{normal});
  }
}

TEST_CASE("invalid backend URLs are refused, naming --backend and the value", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"https://127.0.0.1:8100", "https is not supported"},
      {"127.0.0.1:8100", "expected a URL like http://127.0.0.1:8100"},
      {"localhost:8100", "expected a URL like http://127.0.0.1:8100"},
      {"ftp://h:21", "expected a URL like http://127.0.0.1:8100"},
      {"http:///v1", "expected a URL like http://127.0.0.1:8100"},
      {"http://h:8100/v1", "a path is not supported"},
      {"http://h:8100?x=1", "a query is not supported"},
      {"http://h:8100#top", "unknown option 'top'; expected #dp=N, #weight=W, #kv-events=tcp://HOST:PORT or "
                            "#kv-replay=tcp://HOST:PORT after the URL, joined by '&'"},
      {"http://h:8100#kv-events=h:5557", "kv-events must be tcp://HOST:PORT"},
      {"http://h:8100#kv-events=ipc:///tmp/x", "kv-events must be tcp://HOST:PORT"},
      {"http://h:8100#kv-events=tcp://h", "kv-events must be tcp://HOST:PORT"},
      {"http://h:8100#kv-events=tcp://h:0", "kv-events must be tcp://HOST:PORT"},
      {"http://h:8100#kv-events=tcp://*:5557", "kv-events: '*' is not an IP address or host name"},
      {"http://h:8100#kv-events=tcp://h:5557/x", "kv-events must be tcp://HOST:PORT"},
      {"http://h:8100#kv-events", "kv-events must be tcp://HOST:PORT"},
      {"http://h:8100#kv-events=tcp://h:1&kv-events=tcp://h:2", "kv-events is given twice"},
      {"http://h:8100#kv-replay=tcp://h:5558", "kv-replay needs kv-events"},
      {"http://h:8100#kv-events=tcp://h:5557&kv-replay=tcp://h", "kv-replay must be tcp://HOST:PORT"},
      {"http://h:8100#dp=8&kv-events=tcp://h:65530", "the KV-event port 65530 + 7 (rank j publishes on PORT+j) is beyond 65535"},
      {"http://h:8100#", "an empty '#' is not supported"},
      {"http://h:8100#dp=0", "dp must be the number of DP ranks behind the URL, 1 to 1024"},
      {"http://h:8100#dp=1025", "dp must be the number of DP ranks behind the URL, 1 to 1024"},
      {"http://h:8100#dp=two", "dp must be the number of DP ranks"},
      {"http://h:8100#dp", "dp must be the number of DP ranks"},
      {"http://h:8100#dp=2&dp=2", "dp is given twice"},
      {"http://h:8100#weight=0", "weight must be a whole number from 1 to 10000 (to take a backend out of rotation, drain it)"},
      {"http://h:8100#weight=1.5", "weight must be a whole number"},
      {"http://h:8100#dp=2&weight=2&weight=3", "weight is given twice"},
      {"http://h:8100#dp=2&rank=1", "unknown option 'rank=1'"},
      // host:port@rank, as two other routers wrote a DP rank, is user info to a URL parser: refused, with the way.
      {"http://h:8100@1", "user info ('user@') is not supported; for DP ranks behind one URL write http://HOST:PORT#dp=N"},
      {"http://user:pw@h:8100", "user info"},
      {"http://h:0", "port must be a number from 1 to 65535"},
      {"http://h:65536", "port must be a number from 1 to 65535"},
      {"http://h:", "port must be a number from 1 to 65535"},
      {"http://h%41:80", "is not an IP address or host name"},
      {"http://300.1.1.1:80", "is not an IP address or host name"},
      {"http://-h:80", "is not an IP address or host name"},
      {"not a url", "expected a URL"},
  };
  for (const auto& [bad, why] : cases) {
    INFO(bad);
    const std::string msg = error_of({"--backend", bad});
    CHECK_THAT(msg, Catch::Contains("invalid --backend '" + bad + "'"));
    CHECK_THAT(msg, Catch::Contains(why));
  }
}

TEST_CASE("#dp=N puts N ranks behind one URL and #weight=W weights each of them", "[config]") {
  const auto s = run({"--backend", "http://a:1#dp=4&weight=3", "--backend", "http://b:2", "--backend",
                      "http://c:3/#weight=2&dp=2,http://d:4#dp=1"});
  REQUIRE(s.backends.size() == 4);
  CHECK(s.backends[0] == cfg::backend_spec{"http://a:1", 4, 3});
  CHECK(s.backends[1] == cfg::backend_spec{"http://b:2", 1, 1});
  CHECK(s.backends[2] == cfg::backend_spec{"http://c:3", 2, 2});  // normalised; options in any order
  CHECK(s.backends[3] == cfg::backend_spec{"http://d:4", 1, 1});
  // The same server twice is refused whatever its options, naming the first rank it had.
  CHECK_THAT(error_of({"--backend", "http://a:1#dp=2,http://b:2,http://a:1#dp=3"}),
             Catch::Contains("same engine as rank 0"));
  CHECK_THAT(error_of({"--backend", "http://a:1#dp=2,http://b:2,http://b:2#weight=2"}),
             Catch::Contains("same engine as rank 2"));
  CHECK_THAT(error_of({"--backend", "http://a:1#dp=1024,http://b:2#dp=1024,http://c:3#dp=1024,http://d:4#dp=1024,"
                                    "http://e:5#dp=1"}),
             Catch::Contains("more than 4096 DP ranks"));
}

TEST_CASE("#kv-events= and #kv-replay= name the engines' event publishers, rank j on PORT+j", "[config][kv]") {
  const auto s = run({"--backend", "http://a:1#dp=4&kv-events=tcp://A:5557&kv-replay=tcp://10.0.0.1:5657",
                      "--backend", "http://b:2#kv-events=tcp://[::1]:6000", "--backend", "http://c:3"});
  REQUIRE(s.backends.size() == 3);
  REQUIRE(s.backends[0].kv_events);
  CHECK(s.backends[0].dp == 4);
  CHECK(*s.backends[0].kv_events == cfg::zmq_endpoint{"a", 5557});  // host names are case-insensitive
  CHECK(s.backends[0].kv_events->for_rank(3) == "tcp://a:5560");
  REQUIRE(s.backends[0].kv_replay);
  CHECK(s.backends[0].kv_replay->for_rank(0) == "tcp://10.0.0.1:5657");
  REQUIRE(s.backends[1].kv_events);
  CHECK(s.backends[1].kv_events->for_rank(0) == "tcp://[::1]:6000");
  CHECK_FALSE(s.backends[1].kv_replay);
  CHECK_FALSE(s.backends[2].kv_events);
  CHECK(cfg::any_backend_has_kv_events(s));
  CHECK_FALSE(cfg::any_backend_has_kv_events(run({"--backend", "http://c:3"})));
  // The order of the fragment's options does not matter.
  const auto t = run({"--backend", "http://a:1#kv-events=tcp://a:5557&dp=2"});
  CHECK(t.backends[0].dp == 2);
  CHECK(t.backends[0].kv_events->for_rank(1) == "tcp://a:5558");
}

TEST_CASE("the options --block-size, --kv-index-blocks and --tokenize", "[config][kv]") {
  const auto defaults = run({"--backend", "http://a:1"});
  CHECK(defaults.block_size == 16);
  CHECK(defaults.kv_index_blocks == 262'144);
  CHECK(defaults.tokenize == cfg::tokenize_mode::off);
  const auto s = run({"--backend", "http://a:1", "--block-size", "64", "--kv-index-blocks", "1000", "--tokenize", "engine"});
  CHECK(s.block_size == 64);
  CHECK(s.kv_index_blocks == 1000);
  CHECK(s.tokenize == cfg::tokenize_mode::engine);
  CHECK_THAT(error_of({"--backend", "http://a:1", "--block-size", "0"}), Catch::Contains("invalid --block-size '0'"));
  CHECK_THAT(error_of({"--backend", "http://a:1", "--kv-index-blocks", "2000000"}), Catch::Contains("invalid --kv-index-blocks"));
  CHECK_THAT(error_of({"--backend", "http://a:1", "--tokenize", "yes"}), Catch::Contains("invalid --tokenize 'yes'"));
}

TEST_CASE("the engine-aware options parse and refuse what they cannot use", "[config]") {
  const auto s = run({"--backend", "http://a:1", "--kv-pressure-weight", "2.5", "--default-max-tokens", "512",
                      "--slow-start", "30s", "--stats-interval", "0"});
  CHECK(s.kv_pressure_weight == 2.5);
  CHECK(s.default_max_tokens == 512);
  CHECK(s.slow_start == std::chrono::seconds(30));
  CHECK(s.stats_interval == std::chrono::milliseconds(0));
  CHECK(cfg::engine_stats_interval(s, true) == std::chrono::milliseconds(0));
  const auto defaults = run({"--backend", "http://a:1"});
  CHECK(defaults.kv_pressure_weight == 6.0);
  CHECK(defaults.slow_start == std::chrono::milliseconds(0));
  CHECK_FALSE(defaults.stats_interval.has_value());
  // Unset: read for a policy that balances on the numbers, not for the others.
  CHECK(cfg::engine_stats_interval(defaults, true) == std::chrono::milliseconds(100));
  CHECK(cfg::engine_stats_interval(defaults, false) == std::chrono::milliseconds(0));
  for (const std::string bad : {"-1", "nan", "inf", "1001", "six", ""}) {
    INFO(bad);
    CHECK_THAT(error_of({"--backend", "http://a:1", "--kv-pressure-weight", bad}),
               Catch::Contains("expected a number from 0 to 1000"));
  }
  CHECK_THAT(error_of({"--backend", "http://a:1", "--default-max-tokens", "0"}), Catch::Contains("--default-max-tokens"));
}

TEST_CASE("an https backend gets a message that says TLS to engines is unsupported", "[config]") {
  CHECK(error_of({"--backend", "https://h:8100"}) ==
        "invalid --backend 'https://h:8100': https is not supported (dplb talks plain HTTP to the engines); use "
        "http://HOST:PORT");
}

TEST_CASE("an empty entry in a backend list is refused", "[config]") {
  CHECK_THAT(error_of({"--backend", "http://a:1,,http://b:2"}), Catch::Contains("empty entry"));
  CHECK_THAT(error_of({"--backend", "http://a:1,"}), Catch::Contains("invalid --backend 'http://a:1,'"));
  CHECK_THAT(error_of({"--backend", ""}), Catch::Contains("invalid --backend '': empty entry"));
}

TEST_CASE("the same engine twice is refused, naming the duplicate and the first rank", "[config]") {
  SECTION("literally repeated") {
    CHECK(error_of({"--backend", "http://a:1", "--backend", "http://b:2", "--backend", "http://a:1"}) ==
          "duplicate --backend 'http://a:1': same engine as rank 0 ('http://a:1'); list each engine once");
  }
  SECTION("spelled differently but equal once normalised") {
    const std::string msg = error_of({"--backend", "http://b:2,http://A:1", "--backend", "http://a:1/"});
    CHECK_THAT(msg, Catch::Contains("duplicate --backend 'http://a:1/'"));
    CHECK_THAT(msg, Catch::Contains("rank 1 ('http://A:1')"));
  }
  SECTION("default port made explicit") {
    CHECK_THAT(error_of({"--backend", "http://h,http://h:80"}), Catch::Contains("duplicate --backend 'http://h:80'"));
  }
}

TEST_CASE("option --listen accepts IPv4, bracketed IPv6, host names and port 0", "[config]") {
  struct expected {
    std::string given;
    std::string host;
    std::uint16_t port;
  };
  const std::vector<expected> cases{
      {"0.0.0.0:8000", "0.0.0.0", 8000},       {"127.0.0.1:0", "127.0.0.1", 0},
      {"[::1]:8000", "::1", 8000},             {"[::]:65535", "::", 65535},
      {"localhost:8080", "localhost", 8080},   {"lb.example.com:80", "lb.example.com", 80},
      {"[fe80::1:2]:1", "fe80::1:2", 1},
  };
  for (const auto& c : cases) {
    INFO(c.given);
    const auto s = run({"--listen", c.given, one_backend});
    CHECK(s.listen.host == c.host);
    CHECK(s.listen.port == c.port);
  }
}

TEST_CASE("invalid --listen values are refused, naming --listen and the value", "[config]") {
  CHECK(error_of({"--listen", "8000", one_backend}) ==
        "invalid --listen '8000': expected HOST:PORT, e.g. 0.0.0.0:8000");
  const std::vector<std::pair<std::string, std::string>> cases{
      {":8000", "expected HOST:PORT"},
      {"0.0.0.0", "expected HOST:PORT"},
      {"0.0.0.0:", "port must be a number from 0 to 65535"},
      {"0.0.0.0:65536", "port must be a number from 0 to 65535"},
      {"0.0.0.0:-1", "port must be a number from 0 to 65535"},
      {"0.0.0.0:80x", "port must be a number from 0 to 65535"},
      {"::1:8000", "an IPv6 address needs brackets"},
      {"[::1]8000", "expected [IPV6]:PORT"},
      {"[::1]", "expected [IPV6]:PORT"},
      {"[nope]:80", "is not an IPv6 address"},
      {"*:8000", "is not an IP address or host name"},
      {"256.0.0.1:80", "is not an IP address or host name"},
      {"bad host:80", "is not an IP address or host name"},
      {"", "expected HOST:PORT"},
  };
  for (const auto& [bad, why] : cases) {
    INFO(bad);
    const std::string msg = error_of({"--listen", bad, one_backend});
    CHECK_THAT(msg, Catch::StartsWith("invalid --listen '" + bad + "'"));
    CHECK_THAT(msg, Catch::Contains(why));
  }
}

TEST_CASE("option --policy accepts the known policies and refuses others", "[config]") {
  CHECK(run({"--policy", "round-robin", one_backend}).policy == "round-robin");
  CHECK(run({"--policy", "least-inflight", one_backend}).policy == "least-inflight");
  CHECK(run({"--policy", "random", one_backend}).policy == "random");
  CHECK(run({"--policy", "engine-stats", one_backend}).policy == "engine-stats");
  CHECK(run({"--policy", "least-load", one_backend}).policy == "least-load");
  CHECK(run({"--policy", "least-tokens", one_backend}).policy == "least-tokens");
  CHECK(run({"--policy", "Round-Robin", one_backend}).policy == "round-robin");  // stored canonical
  CHECK(error_of({"--policy", "fastest", one_backend}) ==
        "invalid --policy 'fastest': expected round-robin, least-inflight, least-load, least-tokens, prefix-aware, random or engine-stats");
  CHECK(error_of({"--policy", "", one_backend}) ==
        "invalid --policy '': expected round-robin, least-inflight, least-load, least-tokens, prefix-aware, random or engine-stats");
}

TEST_CASE("option --log-level accepts exactly spdlog's level names", "[config]") {
  const std::vector<std::pair<std::string, spdlog::level::level_enum>> levels{
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},       {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"error", spdlog::level::err},         {"critical", spdlog::level::critical},
      {"off", spdlog::level::off},
  };
  for (const auto& [name, level] : levels) {
    INFO(name);
    const auto s = run({"--log-level", name, one_backend});
    CHECK(s.log_level == name);
    // The logging setup hands the name to spdlog, which must read it as the same level.
    CHECK(spdlog::level::from_str(s.log_level) == level);
  }
  CHECK(run({"--log-level", "WARN", one_backend}).log_level == "warn");
  const std::string msg = error_of({"--log-level", "verbose", one_backend});
  CHECK(msg == "invalid --log-level 'verbose': expected trace, debug, info, warn, error, critical or off");
}

TEST_CASE("option --log-format accepts text and json", "[config]") {
  CHECK(run({"--log-format", "json", one_backend}).log_fmt == cfg::log_format::json);
  CHECK(run({"--log-format", "text", one_backend}).log_fmt == cfg::log_format::text);
  CHECK(error_of({"--log-format", "xml", one_backend}) == "invalid --log-format 'xml': expected text or json");
}

TEST_CASE("numeric options accept their range and refuse the rest, naming option and value", "[config]") {
  struct range {
    std::string flag;
    std::string min;
    std::string max;
    std::string below;  // "" when the minimum is 0 (nothing below to try)
    std::string above;
  };
  const std::vector<range> ranges{
      {"threads", "0", "256", "", "257"},
      {"stats-interval", "0", "86400000", "", "86400001"},
      {"max-request-body-bytes", "1", "4294967296", "0", "4294967297"},
      {"max-header-bytes", "1", "65536", "0", "65537"},
      {"client-idle-timeout-ms", "1", "86400000", "0", "86400001"},
      {"request-read-timeout-ms", "1", "86400000", "0", "86400001"},
      {"upstream-connect-timeout-ms", "1", "86400000", "0", "86400001"},
      {"upstream-read-timeout-ms", "1", "86400000", "0", "86400001"},
      {"client-write-timeout-ms", "1", "86400000", "0", "86400001"},
      {"upstream-idle-timeout-ms", "1", "86400000", "0", "86400001"},
      {"upstream-max-idle-per-rank", "0", "65536", "", "65537"},
  };
  for (const auto& r : ranges) {
    INFO("--" << r.flag);
    CHECK_NOTHROW(run({"--" + r.flag, r.min, one_backend}));
    CHECK_NOTHROW(run({"--" + r.flag, r.max, one_backend}));
    const bool duration = r.flag.ends_with("-ms") || r.flag == "stats-interval";
    std::vector<std::string> bad{r.above, "abc", "-1", "1.5", " 5", "+5", "99999999999999999999999"};
    if (!r.below.empty()) bad.push_back(r.below);
    if (!duration) bad.push_back("10ms");  // a unit is only for durations
    for (const auto& value : bad) {
      INFO("value '" << value << "'");
      CHECK(error_of({"--" + r.flag + "=" + value, one_backend}) ==
            "invalid --" + r.flag + " '" + value + "': expected a whole number from " + r.min + " to " + r.max +
                (r.flag == "threads"                      ? " (threads)"
                 : duration                               ? " (ms), or a duration such as 250ms or 1.5s"
                 : r.flag == "upstream-max-idle-per-rank" ? " (connections)"
                                                          : " (bytes)"));
    }
  }
}

TEST_CASE("option --prefix-index-blocks stops where 4096 ranks' blocks would outgrow the index's 32-bit ids",
          "[config]") {
  // Every rank's blocks have an id of their own, and one id means none: 4096 x N must stay below 2^32.
  CHECK(std::uint64_t{4096} * 1048575 < std::uint64_t{1} << 32);
  CHECK(std::uint64_t{4096} * 1048576 == std::uint64_t{1} << 32);
  CHECK(run({"--prefix-index-blocks", "1048575", one_backend}).prefix_index_blocks == 1048575);
  for (const std::string value : {"1048576", "16777216"}) {
    for (const auto& args : {std::vector<std::string>{"--prefix-index-blocks", value, one_backend},
                             std::vector<std::string>{"--check-config", "--prefix-index-blocks", value, one_backend}}) {
      CHECK(error_of(args) == "invalid --prefix-index-blocks '" + value +
                                  "': expected a whole number from 1 to 1048575 (blocks): the prefix index numbers "
                                  "its blocks with 32-bit ids, and this many blocks for each of up to 4096 ranks "
                                  "must fit in them");
    }
  }
}

TEST_CASE("durations take whole milliseconds or an explicit ms or s unit", "[config]") {
  const std::vector<std::pair<std::string, std::int64_t>> accepted{
      {"250", 250}, {"250ms", 250}, {"2s", 2'000}, {"0.1s", 100}, {"1.25s", 1'250}, {"1.005s", 1'005}};
  for (const auto& [text, ms] : accepted) {
    INFO(text);
    CHECK(run({"--stats-interval", text, one_backend}).stats_interval.value() == std::chrono::milliseconds(ms));
    CHECK(run({"--client-idle-timeout-ms", text, one_backend}).client_idle_timeout == std::chrono::milliseconds(ms));
  }
  for (const std::string text : {"1.0005s", "s", "ms", ".5s", "1.s", "5 s", "5m", "1e3", "86401s"}) {
    INFO(text);
    CHECK_THAT(error_of({"--stats-interval", text, one_backend}), Catch::StartsWith("invalid --stats-interval '" + text + "'"));
  }
}

TEST_CASE("numeric values reach the settings unchanged at the range edges", "[config]") {
  const auto s = run({"--threads", "256", "--max-request-body-bytes", "4294967296", "--upstream-read-timeout-ms",
                      "86400000", "--upstream-max-idle-per-rank", "0", one_backend});
  CHECK(s.threads == 256);
  CHECK(s.max_request_body_bytes == 4294967296ull);
  CHECK(s.upstream_read_timeout == std::chrono::milliseconds(86'400'000));
  CHECK(s.upstream_max_idle_per_rank == 0);
}

TEST_CASE("no backend at all is an error that says how to give one", "[config]") {
  CHECK(error_of({}) == "no backend given: pass --backend http://HOST:PORT (repeatable) or set DPLB_BACKENDS (or --prefill and --decode for disaggregated serving)");
  CHECK(error_of({"--listen", "0.0.0.0:8000", "--policy", "round-robin"}) ==
        "no backend given: pass --backend http://HOST:PORT (repeatable) or set DPLB_BACKENDS (or --prefill and --decode for disaggregated serving)");
}

TEST_CASE("command-line mistakes give one line that points to --help", "[config]") {
  CHECK(error_of({"--foo", one_backend}) == "unknown option '--foo'; see 'dplb --help'");
  CHECK(error_of({"--foo=1", one_backend}) == "unknown option '--foo'; see 'dplb --help'");
  CHECK(error_of({"--polcy", "round-robin", one_backend}) ==
        "unknown option '--polcy' (did you mean '--policy'?); see 'dplb --help'");
  // Abbreviations are not guessed: a script must not change meaning when an option is added.
  CHECK_THAT(error_of({"--pol", "round-robin", one_backend}), Catch::StartsWith("unknown option '--pol'"));
  CHECK_THAT(error_of({"-h"}), Catch::StartsWith("unknown option '-h'"));
  CHECK_THAT(error_of({"-listen", "0.0.0.0:1", one_backend}), Catch::StartsWith("unknown option '-listen'"));
  CHECK(error_of({one_backend, "stray"}) == "unexpected argument 'stray'; options start with '--', see 'dplb --help'");
  CHECK(error_of({one_backend, "--listen"}) == "option '--listen' needs a value; see 'dplb --help'");
  CHECK(error_of({"--listen", "--backend", "http://h:1"}) == "option '--listen' needs a value; see 'dplb --help'");
  CHECK(error_of({one_backend, "--threads="}) == "option '--threads' needs a value after '='; see 'dplb --help'");
  CHECK(error_of({"--version=2"}) == "option '--version' takes no value; see 'dplb --help'");
  CHECK(error_of({"--policy", "round-robin", "--policy", "least-inflight", one_backend}) ==
        "option '--policy' given more than once ('round-robin' and 'least-inflight'); pass it once");
}

TEST_CASE("option --help documents every option with its environment variable, config key and default", "[config]") {
  const auto result = parse({"--help"});
  CHECK_FALSE(result.run.has_value());
  const std::string& help = result.print_and_exit;
  CHECK(help == cfg::help_text());
  CHECK_THAT(help, Catch::Contains("Usage: dplb --listen HOST:PORT --backend URL"));
  CHECK_THAT(help, Catch::Contains("round-robin|least-inflight"));
  CHECK_THAT(help, Catch::Contains("command line > environment > config file > default"));
  const std::vector<std::string> flags{
      "listen",
      "backend",
      "policy",
      "stats-interval",
      "threads",
      "config",
      "log-level",
      "log-format",
      "max-request-body-bytes",
      "max-header-bytes",
      "client-idle-timeout-ms",
      "request-read-timeout-ms",
      "upstream-connect-timeout-ms",
      "upstream-read-timeout-ms",
      "client-write-timeout-ms",
      "upstream-idle-timeout-ms",
      "upstream-max-idle-per-rank",
      "admin-listen",
      "admin-token-file",
  };
  for (const auto& flag : flags) {
    INFO(flag);
    std::string snake = flag;
    std::replace(snake.begin(), snake.end(), '-', '_');
    std::string env = "DPLB_" + snake;
    std::transform(env.begin(), env.end(), env.begin(), [](unsigned char c) { return std::toupper(c); });
    if (flag == "backend") {
      env = "DPLB_BACKENDS";
      snake = "backends";
    }
    CHECK_THAT(help, Catch::Contains("--" + flag + " "));
    CHECK_THAT(help, Catch::Contains("env " + env));
    if (flag != "config") CHECK_THAT(help, Catch::Contains("config key \"" + snake + "\""));
  }
  CHECK_THAT(help, Catch::Contains("--help"));
  CHECK_THAT(help, Catch::Contains("--version"));
  // Defaults are printed from the settings struct itself.
  CHECK_THAT(help, Catch::Contains("default 0.0.0.0:8000"));
  CHECK_THAT(help, Catch::Contains("default least-inflight"));
  CHECK_THAT(help, Catch::Contains("default 67108864"));
  CHECK_THAT(help, Catch::Contains("default 600000"));
  CHECK_THAT(help, Catch::Contains("DPLB_ADMIN_TOKEN (environment only)"));  // the one setting with no flag
  CHECK(help.back() == '\n');
}

TEST_CASE("option --help and --version answer even when the rest would be refused", "[config]") {
  const cfg::environment broken{{"DPLB_POLICY", "fastest"}, {"DPLB_CONFIG", "/nonexistent/dplb.json"}};
  CHECK_FALSE(parse({"--help"}, broken).run.has_value());
  CHECK_FALSE(parse({"--listen", "nonsense", "--help"}, broken).print_and_exit.empty());
  CHECK(parse({"--version"}, broken).print_and_exit == std::string("dplb ") + DPLB_VERSION + "\n");
  CHECK_FALSE(parse({"--version"}, broken).run.has_value());
  // An unknown flag is still an error: the command line itself is wrong.
  CHECK_THAT(error_of({"--help", "--foo"}), Catch::StartsWith("unknown option '--foo'"));
}

TEST_CASE("option --version prints dplb and the build's version", "[config]") {
  const std::string text = parse({"--version"}).print_and_exit;
  CHECK(text == "dplb " DPLB_VERSION "\n");
  CHECK(std::string(DPLB_VERSION).find('.') != std::string::npos);
}

TEST_CASE("option --check-config summarises a valid configuration and refuses a broken one as a run would", "[config]") {
  const auto checked = parse({"--check-config", "--listen", "127.0.0.1:9000", "--backend",
                              "http://a:8000#dp=4,http://b:8000", "--policy", "round-robin"});
  CHECK_FALSE(checked.run.has_value());
  CHECK_THAT(checked.print_and_exit, Catch::StartsWith("dplb: configuration OK\n"));
  CHECK_THAT(checked.print_and_exit, Catch::Contains("listen 127.0.0.1:9000"));
  CHECK_THAT(checked.print_and_exit, Catch::Contains("cluster default: 2 backends, 5 ranks, policy round-robin"));
  CHECK_THAT(checked.print_and_exit, Catch::Contains("2 backends, 5 ranks in all"));
  // The same errors as a run: a wrong value is refused, not summarised.
  CHECK_THAT(error_of({"--check-config", "--backend", "http://a:8000", "--policy", "fastest"}),
             Catch::Contains("fastest"));
  CHECK_THAT(error_of({"--check-config", "--backend", "http://a:8000", "--admin-listen", "127.0.0.1:0"}),
             Catch::Contains("token"));
}

TEST_CASE("process_environment reads DPLB_* variables from the real environment", "[config]") {
  REQUIRE(::setenv("DPLB_UNIT_TEST_PROBE", "a=b,c", 1) == 0);
  const cfg::environment env = cfg::process_environment();
  ::unsetenv("DPLB_UNIT_TEST_PROBE");
  REQUIRE(env.contains("DPLB_UNIT_TEST_PROBE"));
  CHECK(env.at("DPLB_UNIT_TEST_PROBE") == "a=b,c");  // split at the first '=' only
  for (const auto& [name, value] : env) CHECK(name.starts_with("DPLB_"));
}
