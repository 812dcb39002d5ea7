#include "dplb/config/settings.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "dplb/config/admin_token.hpp"
#include "dplb/tenants/tenant_directory.hpp"
#include "option_table.hpp"
#include "sources.hpp"
#include "text_file.hpp"
#include "value_parsers.hpp"

#ifndef DPLB_VERSION
#error "DPLB_VERSION must be defined by the build (see CMakeLists.txt)"
#endif

extern char** environ;

// The parts, each in a file of its own: option_table (every option, how a value is checked and stored),
// value_parsers (text to values), sources.hpp (command_line.cpp, config_file.cpp: where values come from),
// help_text (--help). This file puts them together: precedence, the backends and the admin token.

namespace dplb::config {
namespace {

using namespace detail;

// Where an option is given, by precedence: 3 on the command line, 2 in the environment, 1 in the config file,
// 0 nowhere. An empty variable counts as unset: container and systemd files often define every variable.
int source_level(const option_spec& o, const command_line_values& cli, const environment& env, const json& file) {
  if (cli.contains(o.flag)) return 3;
  if (!o.env.empty()) {
    if (const auto it = env.find(std::string(o.env)); it != env.end() && !it->second.empty()) return 2;
  }
  return !o.key.empty() && file.is_object() && file.contains(o.key) ? 1 : 0;
}

// Precedence, per option: command line > environment > config file. Only the winning source is validated,
// so that a flag can override a broken environment variable.
std::optional<raw_value> pick(const option_spec& o, const command_line_values& cli, const environment& env,
                              const json& file, const std::string& file_path) {
  switch (source_level(o, cli, env, file)) {
    case 3: return raw_value{cli.find(o.flag)->second, ""};
    case 2: return raw_value{{env.find(std::string(o.env))->second}, " (from " + std::string(o.env) + ")"};
    case 1:
      return raw_value{texts_from_json(o, file.at(std::string(o.key)), file_path),
                       " (from key '" + std::string(o.key) + "' in config file '" + file_path + "')"};
    default: return std::nullopt;
  }
}

// --prefill with --decode: one implicit cluster, disaggregated: its decode ranks (cluster 0, --policy, where
// requests go) and its prefill ranks (cluster 1, --prefill-policy). The prefill ranks are numbered first.
void resolve_disaggregated(settings& s, const command_line_values& cli, const environment& env, const json& file,
                           const std::string& path) {
  // Both from one source, never merged: a file's lists and a variable's would make one deployment of two.
  const int prefill_level = source_level(prefill_option(), cli, env, file);
  const int decode_level = source_level(decode_option(), cli, env, file);
  const auto source_name = [](int level) {
    return std::string(level == 3 ? "the command line" : level == 2 ? "the environment" : "the config file");
  };
  if (prefill_level != decode_level) {
    const bool prefill_higher = prefill_level > decode_level;
    const auto given = source_name(std::max(prefill_level, decode_level));
    throw config_error(std::string(prefill_higher ? "--prefill is given without --decode" : "--decode is given without --prefill") +
                       " in " + given + (std::min(prefill_level, decode_level) > 0
                                             ? " (the other list is in " + source_name(std::min(prefill_level, decode_level)) + ")"
                                             : "") +
                       ": a disaggregated dplb needs both pools from one source; pass --prefill URL and --decode URL "
                       "(DPLB_PREFILL and DPLB_DECODE, or the file's \"prefill\" and \"decode\"), or --backend for "
                       "co-located ranks");
  }
  auto prefill = pick(prefill_option(), cli, env, file, path);
  auto decode = pick(decode_option(), cli, env, file, path);
  rank_list ranks;
  ranks.add(*prefill, 1, "", rank_role::prefill, prefill_option());
  ranks.add(*decode, 0, "", rank_role::decode, decode_option());
  s.backends = std::move(ranks).take();
  s.clusters = {cluster_spec{.name = implicit_cluster_name, .models = {}, .policy = s.policy,
                             .role = rank_role::decode, .prefill_pool = 1},
                cluster_spec{.name = implicit_cluster_name, .models = {}, .policy = s.prefill_policy,
                             .role = rank_role::prefill, .decode_pool = 0}};
  s.default_cluster = 0;
}

// The backends come whole from the highest-precedence source that has any, never merged: the command line
// (--backend, or --prefill with --decode), then the environment, then the file's "clusters" or lists. A flat
// list, from whichever source, is one implicit cluster that serves every model with the top-level policy.
void resolve_backends(settings& s, const command_line_values& cli, const environment& env, const json& file,
                      const std::string& path) {
  const int colocated = source_level(backend_option(), cli, env, file);
  const int disaggregated =
      std::max(source_level(prefill_option(), cli, env, file), source_level(decode_option(), cli, env, file));
  const int clusters = file.is_object() && file.contains(clusters_key) ? 1 : 0;
  const int top = std::max({colocated, disaggregated, clusters});
  if (top > 0 && colocated == top && disaggregated == top) {
    throw config_error("both --backend and --prefill/--decode are given" +
                       std::string(top == 3 ? "" : top == 2 ? " (DPLB_BACKENDS and DPLB_PREFILL/DPLB_DECODE)"
                                                            : " (in config file '" + path + "')") +
                       "; give --backend for co-located ranks, or --prefill with --decode for disaggregated ones");
  }
  if (top > 0 && disaggregated == top) {
    resolve_disaggregated(s, cli, env, file, path);
    return;
  }
  if (top > 0 && colocated != top) {
    read_clusters(s, file.at(clusters_key), path);
    return;
  }
  if (auto v = pick(backend_option(), cli, env, file, path)) apply(backend_option(), *v, s);
  if (s.backends.empty()) {
    throw config_error("no backend given: pass --backend http://HOST:PORT (repeatable) or set DPLB_BACKENDS "
                       "(or --prefill and --decode for disaggregated serving)");
  }
  s.clusters = {cluster_spec{.name = implicit_cluster_name, .models = {}, .policy = s.policy}};
  s.default_cluster = 0;
}

// The shared ledger's password from its file (it then overrides one in the URL), and this replica's name:
// the host name and the process id unless --replica-name gives one, unique among replicas on one host
// and across hosts.
void resolve_shared_state(settings& s) {
  if (s.shared_state_password_file) {
    if (!s.shared_state) {
      throw config_error("--shared-state-password-file '" + *s.shared_state_password_file +
                         "' is for --shared-state's Redis; give --shared-state too, or drop it");
    }
    s.shared_state->password = detail::trim_whitespace(
        detail::read_text_file(*s.shared_state_password_file, "shared state password file"));
    if (s.shared_state->password.empty()) {
      throw config_error("shared state password file '" + *s.shared_state_password_file +
                         "' is empty; put Redis's password in it");
    }
  }
  if (s.replica_name.empty()) {
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) != 0 || host[0] == '\0') std::snprintf(host.data(), host.size(), "dplb");
    s.replica_name = std::string(host.data()) + ":" + std::to_string(::getpid());
  }
}

// The admin token comes from --admin-token-file or DPLB_ADMIN_TOKEN, never both (which one was meant
// would be a guess). An admin listener without a token is refused: the API changes routing, and a
// production admin API must never be open.
void resolve_admin_token(settings& s, const environment& env) {
  const auto variable = env.find(admin_token_variable);
  const bool from_env = variable != env.end() && !variable->second.empty();
  if (s.admin_token_file && from_env) {
    throw config_error(std::string("the admin token is given twice, by --admin-token-file '") + *s.admin_token_file +
                       "' and by " + admin_token_variable + "; give one");
  }
  if (s.admin_token_file) {
    s.admin_token = read_admin_token_file(*s.admin_token_file);
  } else if (from_env) {
    s.admin_token = std::string(detail::trim_whitespace(variable->second));
    if (s.admin_token.empty()) throw config_error(std::string(admin_token_variable) + " holds only whitespace; set a token");
  }
  if (s.admin_listen && s.admin_token.empty()) {
    throw config_error(std::string("--admin-listen needs a token, and the admin API is never served without one: "
                                   "name a file holding it with --admin-token-file (or DPLB_ADMIN_TOKEN_FILE) "
                                   "or set ") + admin_token_variable);
  }
}

// The tenants are checked as the running dplb will take them, by building their directory: a list it would
// refuse stops the start here, with its message. And a key required where no tenant holds one would refuse
// every request.
void check_tenants(const settings& s, const command_line_values& cli, const environment& env, const json& file,
                   const std::string& path) {
  try {
    const tenants::tenant_directory directory(s.tenants);
  } catch (const std::invalid_argument& e) {
    throw config_error("invalid \"tenants\" in config file '" + path + "': " + e.what());
  }
  const auto holds_key = [](const tenants::tenant_spec& t) { return !t.api_keys.empty() || !t.api_key_sha256.empty(); };
  if (!s.require_api_key || std::ranges::any_of(s.tenants, holds_key)) return;
  const option_spec& require = find_option("require-api-key");
  const int level = source_level(require, cli, env, file);
  const std::string given = level == 3 ? "--require-api-key is given"
                            : level == 2 ? std::string(require.env) + " is true"
                                         : "\"require_api_key\" is true in config file '" + path + "'";
  throw config_error(given + " but no tenant holds an API key, so every request would be refused with 401: add "
                     "\"api_keys\" or \"api_key_sha256\" to a tenant of the config file's \"tenants\", or drop "
                     "require_api_key");
}

}  // namespace

environment process_environment() {
  environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const auto eq = text.find('=');
    if (!text.starts_with("DPLB_") || eq == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

namespace {

// --check-config's answer: what dplb would serve, in a few lines.
std::string configuration_summary(const settings& s) {
  const auto count = [](std::size_t n, const char* noun) {
    return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
  };
  std::size_t ranks = 0;
  for (const auto& b : s.backends) ranks += b.dp;
  std::string out = "dplb: configuration OK\n";
  out += "  listen " + s.listen.host + ":" + std::to_string(s.listen.port) + "\n";
  for (std::size_t c = 0; c < s.clusters.size(); ++c) {
    const auto& cluster = s.clusters[c];
    std::size_t cluster_ranks = 0, cluster_backends = 0;
    for (const auto& b : s.backends) {
      if (b.cluster != c) continue;
      ++cluster_backends;
      cluster_ranks += b.dp;
    }
    out += "  cluster " + cluster.name + (cluster.role == rank_role::both ? "" : " (" + std::string(role_name(cluster.role)) + ")") +
           ": " + count(cluster_backends, "backend") + ", " + count(cluster_ranks, "rank") + ", policy " +
           cluster.policy + "\n";
  }
  out += "  " + count(s.backends.size(), "backend") + ", " + count(ranks, "rank") + " in all\n";
  if (!s.tenants.empty() || s.require_api_key) {
    std::string names = "default";
    for (const auto& t : s.tenants) {
      if (t.name != "default") names += ", " + t.name;
    }
    out += "  tenants " + names + (s.require_api_key ? "; an API key is required" : "") + "\n";
  }
  if (s.admin_listen) out += "  admin API on " + s.admin_listen->host + ":" + std::to_string(s.admin_listen->port) + "\n";
  return out;
}

}  // namespace

parse_result parse_command_line(int argc, const char* const* argv, const environment& env) {
  const command_line_values cli = read_command_line(argc, argv);
  // --help and --version answer even when the rest of the configuration is incomplete or wrong.
  if (cli.contains("help")) return {std::nullopt, help_text()};
  if (cli.contains("version")) return {std::nullopt, std::string("dplb ") + DPLB_VERSION + "\n"};

  settings s;
  json file;
  const option_spec& config_option = find_option("config");
  if (auto where = pick(config_option, cli, env, file, {})) {
    apply(config_option, *where, s);
    file = read_config_file(*s.config_file);
  }
  const std::string file_path = s.config_file.value_or("");
  for (const auto& o : options()) {
    if (o.kind == value_kind::flag || &o == &config_option || o.kind == value_kind::url_list) continue;
    if (auto v = pick(o, cli, env, file, file_path)) apply(o, *v, s);
  }
  // After the loop: a cluster without a policy of its own takes the top-level one.
  resolve_backends(s, cli, env, file, file_path);
  if (file.is_object() && file.contains(tenants_key)) read_tenants(s, file.at(tenants_key), file_path);
  check_tenants(s, cli, env, file, file_path);
  resolve_admin_token(s, env);
  resolve_shared_state(s);
  if (cli.contains("check-config")) return {std::nullopt, configuration_summary(s)};
  return {std::move(s), {}};
}

}  // namespace dplb::config
