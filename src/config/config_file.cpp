#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <limits>
#include <optional>
#include <set>

#include "dplb/support/policy_names.hpp"
#include "sources.hpp"
#include "text_file.hpp"
#include "value_parsers.hpp"

namespace dplb::config::detail {
namespace {

using support::policy_names;

// The keys of one cluster's object.
constexpr std::array<std::string_view, 8> cluster_keys{"name",    "models",  "backends",       "policy",
                                                        "default", "prefill", "decode", "prefill_policy"};

// nlohmann keeps the last of two equal keys; a repeated key is as likely a mistake as an unknown one, in the
// file's own object and in the objects inside it (a cluster's two "models" would drop the first silently).
// Fed every event of the parse; `message` holds the error for the first repeat, "" while there is none.
struct repeated_key_finder {
  std::vector<std::set<std::string>> open_objects;  // the keys read so far of each object being parsed
  std::string top_key;                              // the file's key whose value is being parsed
  std::string message;

  bool note(json::parse_event_t event, const json& parsed, const std::string& path) {
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end) open_objects.pop_back();
    if (event != json::parse_event_t::key || !message.empty()) return true;
    const std::string key = parsed.get<std::string>();
    if (open_objects.size() == 1) top_key = key;
    if (open_objects.back().insert(key).second) return true;
    message = "key '" + key + "' appears twice in " +
              (open_objects.size() == 1 ? "" : "an object under '" + top_key + "' in ") + "config file '" + path + "'";
    return true;
  }
};

json parse_config_json(const std::string& text, const std::string& path) {
  repeated_key_finder repeats;
  const json::parser_callback_t note_keys = [&](int, json::parse_event_t event, json& parsed) {
    return repeats.note(event, parsed, path);
  };
  json doc;
  try {
    doc = json::parse(text, note_keys);
  } catch (const json::exception& e) {
    // A parse_error, or an out_of_range for a number no double holds (1e400): either way the file is wrong.
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " tag: it means nothing to a user.
    if (const auto tag_end = what.find("] "); what.starts_with("[json.") && tag_end != std::string::npos) {
      what.erase(0, tag_end + 2);
    }
    // The parser quotes what it read last, which in a file with API keys may be part of one: the line and
    // column are left to find the mistake by.
    if (const auto quote = what.find("; last read: "); quote != std::string::npos && text.find("api_key") != std::string::npos) {
      what.erase(quote);
    }
    throw config_error("invalid JSON in config file '" + path + "': " + what);
  }
  if (!doc.is_object()) {
    throw config_error("config file '" + path + "' must hold a JSON object, e.g. {\"backends\": [\"http://127.0.0.1:8100\"]}");
  }
  if (!repeats.message.empty()) throw config_error(repeats.message);
  return doc;
}

// `what` names the object in the message: "config file '/etc/dplb.json'", "cluster 'llama' in config file ...".
template <typename Keys>
void refuse_unknown_keys(const json& object, const Keys& known, const std::string& what) {
  for (const auto& item : object.items()) {
    if (std::find(known.begin(), known.end(), item.key()) != known.end()) continue;
    std::string msg = "unknown key '" + item.key() + "' in " + what;
    if (auto near = closest(item.key(), known)) {
      msg += " (did you mean '" + *near + "'?)";
    } else {
      msg += "; known keys: " + join(known, ", ", ", ");
    }
    throw config_error(msg);
  }
}

// A backend list in the file: an array of URL strings or one comma-separated string; nullopt for another type.
std::optional<std::vector<std::string>> url_texts_from_json(const json& node) {
  if (node.is_string()) return std::vector<std::string>{node.get<std::string>()};
  if (!node.is_array()) return std::nullopt;
  std::vector<std::string> texts;
  for (const auto& item : node) {
    if (!item.is_string()) return std::nullopt;
    texts.push_back(item.get<std::string>());
  }
  return texts;
}

// --- clusters: the file's "clusters" (one per set of models, each with its backends and policy) ---

// A cluster's name labels metrics and log lines, so it keeps to characters every exporter and log parser
// takes as they are.
bool valid_cluster_name(std::string_view name) {
  return !name.empty() && name.size() <= max_cluster_name_length &&
         std::all_of(name.begin(), name.end(), [](unsigned char c) {
           return std::isalnum(c) || c == '.' || c == '_' || c == '-';
         });
}

// One cluster object of the file, with what its error messages call it: "cluster 'llama' in config file
// 'P'" when it has a name, else its place, "clusters[1] in config file 'P'".
struct cluster_source {
  const json& object;
  std::size_t index;
  std::string path;  // of the config file
  std::string place;
  std::string label;

  config_error wrong_type(std::string_view key, std::string_view wanted, const json& value) const {
    return config_error("\"" + std::string(key) + "\" of " + label + " must be " + std::string(wanted) + ", not " +
                        value.type_name());
  }
};

cluster_source cluster_at(const json& clusters, std::size_t index, const std::string& path) {
  const json& object = clusters[index];
  const std::string place = "clusters[" + std::to_string(index) + "] in config file '" + path + "'";
  if (!object.is_object()) {
    throw config_error(place + " must be an object, e.g. {\"name\": \"llama\", \"models\": [...], " +
                       "\"backends\": [...]}, not " + std::string(object.type_name()));
  }
  const auto name = object.find("name");
  const bool named = name != object.end() && name->is_string() && !name->get<std::string>().empty();
  std::string label = named ? "cluster '" + name->get<std::string>() + "' in config file '" + path + "'" : place;
  return {object, index, path, place, std::move(label)};
}

std::string cluster_name_of(const cluster_source& c) {
  const auto name = c.object.find("name");
  if (name == c.object.end()) {
    throw config_error(c.label + " has no \"name\"; give each cluster a name of letters, digits, '.', '_' or '-'");
  }
  if (!name->is_string()) throw c.wrong_type("name", "a string", *name);
  const std::string text = name->get<std::string>();
  if (!valid_cluster_name(text)) {
    throw config_error("invalid \"name\" '" + text + "' of " + c.place + ": use 1 to " +
                       std::to_string(max_cluster_name_length) +
                       " letters, digits, '.', '_' or '-' (it labels the cluster's metrics)");
  }
  return text;
}

// The requests' "model" values the cluster serves, compared exactly as vLLM compares served model names.
std::vector<std::string> cluster_models_of(const cluster_source& c) {
  const auto models = c.object.find("models");
  if (models == c.object.end()) {
    throw config_error(c.label + " has no \"models\"; list the model names it serves (the requests' \"model\")");
  }
  if (!models->is_array()) throw c.wrong_type("models", "an array of model names", *models);
  if (models->empty()) {
    throw config_error("\"models\" of " + c.label + " is empty; list the model names it serves");
  }
  std::vector<std::string> names;
  for (const json& model : *models) {
    if (!model.is_string()) throw c.wrong_type("models", "an array of model names (strings)", model);
    std::string name = model.get<std::string>();
    if (name.empty()) throw config_error("\"models\" of " + c.label + " holds an empty model name; remove it");
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      throw config_error("model '" + name + "' is listed twice in " + c.label + "; list it once");
    }
    names.push_back(std::move(name));
  }
  return names;
}

// One of the cluster's lists ("backends", "prefill" or "decode"), appended to `ranks` (global rank order) in
// cluster `index` with `role`, checked as --backend checks a list.
void add_cluster_list(const cluster_source& c, std::string_view key, std::size_t index, rank_role role,
                      const std::string& name, rank_list& ranks) {
  const auto list = c.object.find(key);
  const auto texts = url_texts_from_json(*list);
  if (!texts) {
    // Name the type of what is wrong: the list itself, or the first entry that is not a string.
    const auto not_text = [](const json& entry) { return !entry.is_string(); };
    throw c.wrong_type(std::string(key), "an array of URL strings",
                       list->is_array() ? *std::find_if(list->begin(), list->end(), not_text) : *list);
  }
  if (texts->empty()) {
    throw config_error("\"" + std::string(key) + "\" of " + c.label + " is empty; list the URLs of the engines that serve its models");
  }
  const auto& option = role == rank_role::prefill ? prefill_option() : role == rank_role::decode ? decode_option() : backend_option();
  ranks.add(raw_value{*texts, " (from \"" + std::string(key) + "\" of " + c.label + ")"}, index, name, role, option);
}

// The cluster's backends: "backends" (co-located ranks), or "prefill" and "decode" (disaggregated: the
// prefill ranks go to cluster `prefill_index`, its companion). Returns the cluster's role.
rank_role add_cluster_backends(const cluster_source& c, const std::string& name, std::size_t prefill_index,
                               rank_list& ranks) {
  const bool colocated = c.object.contains("backends");
  const bool prefill = c.object.contains("prefill"), decode = c.object.contains("decode");
  if (colocated && (prefill || decode)) {
    throw config_error(c.label + " has both \"backends\" and \"prefill\"/\"decode\"; give \"backends\" for "
                       "co-located ranks, or \"prefill\" with \"decode\" for disaggregated ones");
  }
  if (colocated) {
    if (c.object.contains("prefill_policy")) {
      throw config_error(c.label + " has a \"prefill_policy\" but no \"prefill\" ranks; remove it, or list "
                         "\"prefill\" and \"decode\" instead of \"backends\"");
    }
    add_cluster_list(c, "backends", c.index, rank_role::both, name, ranks);
    return rank_role::both;
  }
  if (!prefill && !decode) {
    throw config_error(c.label + " has no \"backends\"; list the URLs of the engines that serve its models (or "
                       "\"prefill\" and \"decode\" for disaggregated serving)");
  }
  if (!prefill || !decode) {
    throw config_error(c.label + " has \"" + (prefill ? "prefill" : "decode") + "\" without \"" +
                       (prefill ? "decode" : "prefill") + "\"; a disaggregated cluster needs both pools");
  }
  add_cluster_list(c, "prefill", prefill_index, rank_role::prefill, name, ranks);
  add_cluster_list(c, "decode", c.index, rank_role::decode, name, ranks);
  return rank_role::decode;
}

// The cluster's own policy, validated as --policy is; the top-level policy when it sets none.
// (`key` "prefill_policy": its prefill pool's, validated alike; the top-level prefill_policy when it sets none.)
std::string cluster_policy_of(const cluster_source& c, const std::string& default_policy, const std::string& key = "policy") {
  const auto policy = c.object.find(key);
  if (policy == c.object.end()) return default_policy;
  if (!policy->is_string()) throw c.wrong_type(key, "a string", *policy);
  const auto choice = canonical_choice(policy_names, policy->get<std::string>());
  if (!choice) {
    throw config_error("invalid \"" + key + "\" '" + policy->get<std::string>() + "' of " + c.label + ": expected " +
                       join(policy_names, ", ", " or "));
  }
  return std::string(*choice);
}

bool marked_default(const cluster_source& c) {
  const auto mark = c.object.find("default");
  if (mark == c.object.end()) return false;
  if (!mark->is_boolean()) throw c.wrong_type("default", "true or false", *mark);
  return mark->get<bool>();
}

// A model served by two clusters would leave the cluster of its requests to a guess.
void refuse_shared_models(const std::vector<cluster_spec>& clusters, const std::string& path) {
  std::map<std::string_view, std::string_view> cluster_of_model;
  for (const cluster_spec& c : clusters) {
    for (const std::string& model : c.models) {
      const auto [it, fresh] = cluster_of_model.emplace(model, c.name);
      if (!fresh) {
        throw config_error("model '" + model + "' is listed by cluster '" + std::string(it->second) +
                           "' and by cluster '" + c.name + "' in config file '" + path +
                           "'; a model belongs to one cluster");
      }
    }
  }
}

void refuse_shared_name(const std::vector<cluster_spec>& clusters, const std::string& name, const std::string& path) {
  const auto named_so = [&](const cluster_spec& c) { return c.name == name; };
  const auto same = std::find_if(clusters.begin(), clusters.end(), named_so);
  if (same == clusters.end()) return;
  throw config_error("two clusters are named '" + name + "' in config file '" + path + "' (clusters[" +
                     std::to_string(same - clusters.begin()) + "] and clusters[" + std::to_string(clusters.size()) +
                     "]); give each its own name");
}

// One cluster of the file, checked alone and against the clusters before it; its backends go to `ranks`. A
// disaggregated cluster's prefill ranks go to cluster `prefill_index`, made by read_clusters after the rest.
cluster_spec read_cluster(const cluster_source& source, const settings& s, std::size_t prefill_index, rank_list& ranks) {
  refuse_unknown_keys(source.object, cluster_keys, source.label);
  std::string name = cluster_name_of(source);
  refuse_shared_name(s.clusters, name, source.path);
  std::vector<std::string> models = cluster_models_of(source);
  const rank_role role = add_cluster_backends(source, name, prefill_index, ranks);
  std::string policy = cluster_policy_of(source, s.policy);
  cluster_spec cluster{.name = std::move(name), .models = std::move(models), .policy = std::move(policy), .role = role};
  if (role == rank_role::decode) cluster.prefill_pool = prefill_index;
  return cluster;
}

// --- tenants: the file's "tenants" (whose a request is, that tenant's share and its limits) ---

constexpr std::array<std::string_view, 10> tenant_keys{
    "name",       "api_keys",          "api_key_sha256",    "weight",      "requests_per_second", "burst",
    "max_queued", "tokens_per_minute", "max_queue_wait_ms", "min_priority"};

// A weight is a share: a million to one is already more than any deployment means, and it keeps a sum of
// weights far from overflowing.
constexpr std::uint64_t max_tenant_weight = 1'000'000;
// As --max-queued-requests: a tenant's queue is a part of dplb's.
constexpr std::uint64_t max_tenant_queued = 10'000'000;

// One tenant object of the file. Its messages name a value by its place, "config file 'P': tenants[2].weight:
// must be an integer >= 1, not 0", and show a number it refuses but never a string: that may be a key.
class tenant_source {
 public:
  tenant_source(const json& object, std::size_t index, const std::string& path)
      : object_(object), index_(index), path_(path) {}

  std::string place(std::string_view field = {}) const {
    return "tenants[" + std::to_string(index_) + "]" + (field.empty() ? "" : "." + std::string(field));
  }
  config_error refused(std::string_view field, std::string_view why) const {
    return config_error("config file '" + path_ + "': " + place(field) + ": " + std::string(why));
  }
  const json* find(std::string_view key) const {
    const auto found = object_.find(key);
    return found == object_.end() ? nullptr : &*found;
  }

  std::string name() const {
    const json* name = find("name");
    if (name == nullptr) {
      throw refused("name", "required: 1 to 64 of A-Z a-z 0-9 . _ - (\"default\" configures the default tenant)");
    }
    if (!name->is_string()) throw refused("name", "must be a string, not " + shown(*name));
    return name->get<std::string>();
  }

  // An integer from min to max, if given.
  std::optional<std::uint64_t> whole(std::string_view key, std::uint64_t min, std::uint64_t max) const {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (value->is_number_unsigned()) {
      const auto n = value->get<std::uint64_t>();
      if (n >= min && n <= max) return n;
      if (n > max) {
        throw refused(key, "must be an integer >= " + std::to_string(min) + " and at most " + std::to_string(max) +
                               ", not " + shown(*value));
      }
    }
    throw refused(key, "must be an integer >= " + std::to_string(min) + ", not " + shown(*value));
  }

  // An integer of either sign (a 64-bit one), if given.
  std::optional<std::int64_t> signed_whole(std::string_view key) const {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (value->is_number_integer() &&
        (!value->is_number_unsigned() ||
         value->get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))) {
      return value->get<std::int64_t>();
    }
    throw refused(key, "must be an integer (a 64-bit one), not " + shown(*value));
  }

  // A number above 0, a fraction allowed, if given. (JSON holds no infinity or NaN; a literal too large for a
  // double is refused by the parser.)
  std::optional<double> positive(std::string_view key) const {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (value->is_number() && value->get<double>() > 0) return value->get<double>();
    throw refused(key, "must be a number > 0, not " + shown(*value));
  }

  // A list of keys or digests: an array of strings, each named by its place if it is not one.
  std::vector<std::string> strings(std::string_view key) const {
    const json* list = find(key);
    if (list == nullptr) return {};
    if (!list->is_array()) throw refused(key, "must be an array of strings, not " + std::string(list->type_name()));
    std::vector<std::string> texts;
    for (std::size_t i = 0; i < list->size(); ++i) {
      const json& item = (*list)[i];
      if (!item.is_string()) {
        throw refused(std::string(key) + "[" + std::to_string(i) + "]",
                      "must be a string, not " + std::string(item.type_name()));
      }
      texts.push_back(item.get<std::string>());
    }
    return texts;
  }

 private:
  // What a message shows of a refused value: a number itself, anything else by its type.
  static std::string shown(const json& value) { return value.is_number() ? value.dump() : value.type_name(); }

  const json& object_;
  std::size_t index_;
  std::string path_;
};

tenants::tenant_spec read_tenant(const tenant_source& t) {
  tenants::tenant_spec spec{.name = t.name(),
                            .weight = static_cast<std::uint32_t>(t.whole("weight", 1, max_tenant_weight).value_or(1)),
                            .api_keys = t.strings("api_keys"),
                            .api_key_sha256 = t.strings("api_key_sha256"),
                            .requests_per_second = t.positive("requests_per_second")};
  if (const auto burst = t.whole("burst", 1, std::numeric_limits<std::uint64_t>::max())) {
    // Alone it would limit nothing: the burst is the depth of the request rate's bucket.
    if (!spec.requests_per_second) throw t.refused("burst", "needs requests_per_second (a burst is the request rate's)");
    spec.burst = *burst;
  }
  if (const auto queued = t.whole("max_queued", 0, max_tenant_queued)) spec.max_queued = *queued;
  spec.tokens_per_minute = t.positive("tokens_per_minute");
  if (const auto wait = t.whole("max_queue_wait_ms", 1, max_timeout_ms)) {
    spec.max_queue_wait = std::chrono::milliseconds(*wait);
  }
  spec.min_priority = t.signed_whole("min_priority");
  return spec;
}

}  // namespace

json read_config_file(const std::string& path) {
  const json doc = parse_config_json(detail::read_text_file(path, "config file"), path);
  std::vector<std::string_view> keys;
  for (const auto& o : options()) {
    if (!o.key.empty()) keys.push_back(o.key);
  }
  keys.push_back(tenants_key);
  keys.push_back(clusters_key);
  refuse_unknown_keys(doc, keys, "config file '" + path + "'");
  // Which of the two lists the file meant would be a guess; like an unknown key, refused even when a
  // higher-precedence source replaces both.
  for (const option_spec* list : {&backend_option(), &prefill_option(), &decode_option()}) {
    if (doc.contains(clusters_key) && doc.contains(list->key)) {
      throw config_error("config file '" + path + "' has both \"clusters\" and \"" + std::string(list->key) +
                         "\"; move the " + std::string(list->key) + (list == &backend_option() ? "" : " list") +
                         " into a cluster's \"" + std::string(list->key) + "\" (or drop \"clusters\")");
    }
  }
  return doc;
}

std::vector<std::string> texts_from_json(const option_spec& o, const json& node, const std::string& path) {
  const auto wrong_type = [&](std::string_view wanted) {
    return config_error("key '" + std::string(o.key) + "' in config file '" + path + "' must be " +
                        std::string(wanted) + ", not " + node.type_name());
  };
  switch (o.kind) {
    case value_kind::number:
    case value_kind::decimal:
      // A fraction or a negative number is dumped and then refused with the range, like any bad number.
      if (!node.is_number()) throw wrong_type("a number");
      return {node.dump()};
    case value_kind::url_list:
      if (auto texts = url_texts_from_json(node)) return *texts;
      throw wrong_type("an array of URL strings");
    case value_kind::boolean:
      if (!node.is_boolean()) throw wrong_type("true or false");
      return {node.get<bool>() ? "true" : "false"};
    default:
      // A number where text is parsed as one (kv_pressure_weight) may be written as a JSON number.
      if (!node.is_string()) throw wrong_type("a string");
      return {node.get<std::string>()};
  }
}

void read_clusters(settings& s, const json& clusters, const std::string& path) {
  const std::string key = "key 'clusters' in config file '" + path + "'";
  if (!clusters.is_array()) {
    throw config_error(key + " must be an array of cluster objects, not " + std::string(clusters.type_name()));
  }
  if (clusters.empty()) throw config_error(key + " is empty; define at least one cluster (or remove the key)");
  rank_list ranks;
  std::optional<std::size_t> default_index;
  // The prefill pools of disaggregated clusters come after every cluster of the file, in their order, so
  // that the file's clusters keep their indexes (and the default its place).
  std::vector<cluster_spec> prefill_pools;
  for (std::size_t i = 0; i < clusters.size(); ++i) {
    const cluster_source source = cluster_at(clusters, i, path);
    s.clusters.push_back(read_cluster(source, s, clusters.size() + prefill_pools.size(), ranks));
    if (s.clusters.back().disaggregated()) {
      prefill_pools.push_back(cluster_spec{.name = s.clusters.back().name, .models = {},
                                           .policy = cluster_policy_of(source, s.prefill_policy, "prefill_policy"),
                                           .role = rank_role::prefill, .decode_pool = i});
    }
    if (!marked_default(source)) continue;
    if (default_index) {
      throw config_error("clusters '" + s.clusters[*default_index].name + "' and '" + s.clusters[i].name +
                         "' in config file '" + path + "' are both \"default\": true; mark one");
    }
    default_index = i;
  }
  refuse_shared_models(s.clusters, path);
  for (auto& pool : prefill_pools) s.clusters.push_back(std::move(pool));
  s.backends = std::move(ranks).take();
  s.default_cluster = default_index.value_or(0);
}

void read_tenants(settings& s, const json& tenants, const std::string& path) {
  if (!tenants.is_array()) {
    throw config_error("config file '" + path + "': tenants: must be an array of tenant objects, not " +
                       std::string(tenants.type_name()));
  }
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    const tenant_source source(tenants[i], i, path);
    if (!tenants[i].is_object()) {
      throw source.refused("", "must be an object, e.g. {\"name\": \"team-a\", \"api_key_sha256\": [...], "
                               "\"weight\": 2}, not " + std::string(tenants[i].type_name()));
    }
    refuse_unknown_keys(tenants[i], tenant_keys, source.place() + " in config file '" + path + "'");
    s.tenants.push_back(read_tenant(source));
  }
}

}  // namespace dplb::config::detail
