#pragma once
// Small reads of JSON text that need no tree: how deep a text nests, and where a top-level member's value
// lies, byte for byte. For the places that must bound a body before handing it to a recursive JSON library
// (nlohmann's copy and dump recurse once per level), and that must pass a value on verbatim (an engine's
// kv_transfer_params, whatever its numbers and key order). Pure; never throws; never recurses.

#include <cstddef>
#include <optional>
#include <string_view>

namespace dplb::support {

// The deepest nesting of arrays and objects in a JSON text, strings skipped; it stops counting past `limit`
// (then returns a value above it). The text need not be valid.
std::size_t json_nesting_depth(std::string_view text, std::size_t limit);

// The end of the JSON value that starts at text[at] (a string, an array or object with everything inside it,
// or a bare literal up to the next delimiter): the index just past it, or npos when the text ends first.
// Delimited, not validated: what is inside strings is skipped, escapes included, without being decoded.
std::size_t json_value_end(std::string_view text, std::size_t at);

// The raw text of the value of the top-level member `key` of a JSON object (its first occurrence, the key
// compared as written, without unescaping), or nullopt when the text is not an object (as far as the scan
// can tell) or has no such member. The value is delimited, not validated.
std::optional<std::string_view> json_member_text(std::string_view object_text, std::string_view key);

}  // namespace dplb::support
