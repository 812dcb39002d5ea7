#pragma once
// The option table: every option with its three spellings (flag, environment variable, config key), its
// kind of value, range and default, and how its value is stored into the settings; and `apply`, which
// checks a value as its option's kind requires and stores it.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/config/settings.hpp"
#include "value_parsers.hpp"

namespace dplb::config::detail {

enum class value_kind {
  flag,      // --help, --version: command line only, no value
  boolean,   // a switch: on the command line the flag alone (on); true or false in the environment and the file
  text,      // free text validated by the option's own setter
  choice,    // one of `choices`
  number,    // unsigned integer in [min, max]
  decimal,   // a number with a fraction, validated by the option's own setter
  url_list,  // the backends: repeatable, comma-separated, taken whole from one source
};

// One option's value as found in the source that wins, with what an error message needs to point at it.
struct raw_value {
  std::vector<std::string> texts;  // one entry, except for url_list
  std::string origin;              // "" for the command line, else " (from ...)"
};

struct option_spec {
  std::string_view flag{};        // long name without the leading "--"
  std::string_view env{};         // "" = not settable from the environment
  std::string_view key{};         // "" = not settable from the config file
  std::string_view value_name{};  // shown in --help; choices are listed instead when empty
  std::string_view meaning{};     // --help text
  value_kind kind = value_kind::text;
  std::span<const std::string_view> choices{};
  std::uint64_t min = 0;
  std::uint64_t max = 0;
  std::string_view unit{};
  std::string_view why_max{};  // number: why `max` is what it is, when another part of dplb sets it
  // text, choice and boolean: stores the (validated) value, a boolean's as "true" or "false"; text setters
  // return why the value is bad, "" if good.
  std::string (*set_text)(settings&, std::string_view) = nullptr;
  void (*set_number)(settings&, std::uint64_t) = nullptr;
  std::string (*show_default)(const settings&) = nullptr;
  // false: an error quotes the value without its password (a URL's user information may hold one).
  bool shows_value = true;
};

// Every option, in --help order.
std::span<const option_spec> options();
// The option named `flag` (without "--"); a logic error when there is none.
const option_spec& find_option(std::string_view flag);
const option_spec& backend_option();
const option_spec& prefill_option();  // --prefill
const option_spec& decode_option();   // --decode
// What --help shows as the option's value: its value name, or its choices.
std::string value_name_of(const option_spec& o);

// Throws the config_error "invalid --FLAG 'shown'<origin>: why".
[[noreturn]] void bad_value(const option_spec& o, const raw_value& v, std::string_view shown, std::string_view why);

// Backends in rank order, from one flat list or from each cluster's list in turn. Refuses an engine listed
// twice, in one list or in two clusters (it would get twice its share, and belong to two policies), and
// more than max_ranks ranks in all.
class rank_list {
 public:
  // Appends the backends of `v` (each text a URL or a comma-separated list) to cluster `cluster`, named
  // `cluster_name` in messages ("" for a flat list), each with `role`; `o` (--backend, --prefill or
  // --decode) names the list in messages.
  void add(const raw_value& v, std::size_t cluster, const std::string& cluster_name,
           rank_role role = rank_role::both, const option_spec& o = backend_option()) {
    for (const std::string& text : v.texts) {
      std::size_t start = 0;
      while (true) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        const std::string_view entry = trim(std::string_view(text).substr(start, comma - start));
        if (entry.empty()) {
          bad_value(o, v, text, "empty entry; expected http://HOST:PORT[,http://HOST:PORT...]");
        }
        add_one(v, entry, cluster, cluster_name, role, o);
        if (comma == text.size()) break;
        start = comma + 1;
      }
    }
  }

  std::vector<backend_spec> take() && { return std::move(backends_); }

 private:
  struct first_listing {
    std::size_t rank;
    std::string as_written;
    std::string cluster_name;
  };

  void add_one(const raw_value& v, std::string_view entry, std::size_t cluster, const std::string& cluster_name,
               rank_role role, const option_spec& o) {
    backend_spec normal;
    if (auto why = parse_backend(entry, normal); !why.empty()) bad_value(o, v, entry, why);
    normal.cluster = cluster;
    normal.role = role;
    const auto [it, fresh] = first_.emplace(normal.url, first_listing{ranks_, std::string(entry), cluster_name});
    if (!fresh) {
      const first_listing& first = it->second;
      // One engine in both pools would prefill and decode the same request on itself: refused like any repeat.
      throw config_error("duplicate --" + std::string(o.flag) + " '" + std::string(entry) + "'" + v.origin + ": same engine as rank " +
                         std::to_string(first.rank) + " ('" + first.as_written + "'" +
                         (first.cluster_name.empty() ? "" : " of cluster '" + first.cluster_name + "'") +
                         "); list each engine once" + (cluster_name.empty() ? "" : ", in one cluster"));
    }
    ranks_ += normal.dp;
    if (ranks_ > max_ranks) {
      throw config_error("too many ranks" + v.origin + ": the backends add up to more than " +
                         std::to_string(max_ranks) + " DP ranks" + (cluster_name.empty() ? "" : " over all clusters"));
    }
    backends_.push_back(std::move(normal));
  }

  std::vector<backend_spec> backends_;
  std::size_t ranks_ = 0;
  std::map<std::string, first_listing> first_;  // normal form -> where the engine was first listed
};

// Checks `v` as option `o` requires and stores it into `s`; throws config_error when it is refused.
void apply(const option_spec& o, const raw_value& v, settings& s);

}  // namespace dplb::config::detail
