#pragma once
// Where option values come from, each source read on its own: the command line and the JSON config file
// (with its clusters). The environment is a map the caller passes (process_environment()); precedence
// among the sources is settings.cpp's.

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/config/settings.hpp"
#include "option_table.hpp"

namespace dplb::config::detail {

using json = nlohmann::json;

// --- the command line ---
// Each given option's values by flag (several only for --backend).
using command_line_values = std::map<std::string, std::vector<std::string>, std::less<>>;
// Throws config_error for an unknown option, a missing or extra value, a stray word or a repeated option.
command_line_values read_command_line(int argc, const char* const* argv);

// --- the config file ---
// The one key only the config file has: a cluster is a structure (models, backends, a policy) that
// neither a flag nor a variable can hold.
constexpr std::string_view clusters_key = "clusters";
// The other: a tenant is a structure too (its keys and limits).
constexpr std::string_view tenants_key = "tenants";

// The file's object, its keys checked (unknown or repeated keys, "clusters" and "backends" both).
json read_config_file(const std::string& path);
// A key's value as option texts (a list only for the backends); throws config_error for a wrong JSON type.
std::vector<std::string> texts_from_json(const option_spec& o, const json& node, const std::string& path);
// The file's "clusters": every cluster with its models and policy, their backends flattened in cluster order
// (ranks are numbered globally), and the default cluster (the one marked, else the first).
void read_clusters(settings& s, const json& clusters, const std::string& path);
// The file's "tenants" into s.tenants, each object's keys and value types checked; what only the whole list
// can tell (names, duplicate keys, digests) is tenant_directory's to check. No message quotes a key.
void read_tenants(settings& s, const json& tenants, const std::string& path);

}  // namespace dplb::config::detail
