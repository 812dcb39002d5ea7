#include "kv_transfer.hpp"

#include <algorithm>

#include "engine_metrics.hpp"

namespace dplb::mock {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// A string field that may be absent or null (leg 1 sends nulls); else a string.
std::optional<std::string> optional_string(const json& params, const char* name, std::string& out) {
  const auto found = params.find(name);
  if (found == params.end() || found->is_null()) return std::nullopt;
  if (!found->is_string()) return std::string("kv_transfer_params.") + name + " must be a string";
  out = found->get<std::string>();
  return std::nullopt;
}

std::optional<std::string> optional_bool(const json& params, const char* name, bool& out) {
  const auto found = params.find(name);
  if (found == params.end() || found->is_null()) return std::nullopt;
  if (!found->is_boolean()) return std::string("kv_transfer_params.") + name + " must be a boolean";
  out = found->get<bool>();
  return std::nullopt;
}

std::optional<std::string> read_fields(const json& params, kv_transfer_params& out) {
  for (auto [name, field] : {std::pair{"do_remote_decode", &out.do_remote_decode},
                             std::pair{"do_remote_prefill", &out.do_remote_prefill}}) {
    if (auto error = optional_bool(params, name, *field)) return error;
  }
  for (auto [name, field] : {std::pair{"remote_engine_id", &out.remote_engine_id},
                             std::pair{"remote_request_id", &out.remote_request_id},
                             std::pair{"remote_host", &out.remote_host}}) {
    if (auto error = optional_string(params, name, *field)) return error;
  }
  if (const auto port = params.find("remote_port"); port != params.end() && !port->is_null()) {
    if (!port->is_number_unsigned() || port->get<std::uint64_t>() < 1 || port->get<std::uint64_t>() > 65535)
      return std::string("kv_transfer_params.remote_port must be an integer in [1, 65535]");
    out.remote_port = static_cast<std::uint16_t>(port->get<std::uint64_t>());
  }
  if (const auto ids = params.find("remote_block_ids"); ids != params.end() && !ids->is_null()) {
    if (!ids->is_array()) return std::string("kv_transfer_params.remote_block_ids must be an array of integers");
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned())
        return std::string("kv_transfer_params.remote_block_ids must be an array of integers");
      out.remote_block_ids.push_back(id.get<std::uint64_t>());
    }
  }
  if (const auto tp = params.find("tp_size"); tp != params.end() && !tp->is_null()) {
    if (!tp->is_number_unsigned() || tp->get<std::uint64_t>() < 1)
      return std::string("kv_transfer_params.tp_size must be a positive integer");
    out.tp_size = tp->get<std::uint64_t>();
  }
  return std::nullopt;
}

}  // namespace

std::variant<std::optional<kv_transfer_params>, std::string> read_kv_transfer_params(const json& request) {
  const auto found = request.find("kv_transfer_params");
  if (found == request.end() || found->is_null()) return std::optional<kv_transfer_params>{};
  if (!found->is_object()) return std::string("kv_transfer_params must be an object");
  kv_transfer_params params;
  if (auto error = read_fields(*found, params)) return std::move(*error);
  if (params.do_remote_prefill) {
    // Without these a decode engine could not know where to read the blocks from.
    if (params.remote_engine_id.empty() || params.remote_request_id.empty() || params.remote_host.empty() ||
        params.remote_port == 0) {
      return std::string(
          "kv_transfer_params with do_remote_prefill needs remote_engine_id, remote_request_id, remote_host "
          "and remote_port");
    }
  }
  return std::optional<kv_transfer_params>(std::move(params));
}

ordered_json kv_transfer_answer(const kv_transfer_params& params) {
  ordered_json out;
  out["do_remote_prefill"] = params.do_remote_prefill;
  out["do_remote_decode"] = params.do_remote_decode;
  out["remote_block_ids"] = params.remote_block_ids;
  out["remote_engine_id"] = params.remote_engine_id;
  out["remote_request_id"] = params.remote_request_id;
  out["remote_host"] = params.remote_host;
  out["remote_port"] = params.remote_port;
  out["tp_size"] = params.tp_size;
  return out;
}

std::uint64_t blocks_for(std::uint64_t prompt_tokens, std::uint32_t block_size) {
  const std::uint64_t size = block_size == 0 ? 1 : block_size;
  return std::max<std::uint64_t>(1, prompt_tokens / size + (prompt_tokens % size != 0 ? 1 : 0));
}

std::string render_kv_pull_request(const kv_pull_request& pull) {
  ordered_json body;
  body["remote_engine_id"] = pull.remote_engine_id;
  body["remote_request_id"] = pull.remote_request_id;
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::variant<kv_pull_request, std::string> parse_kv_pull_request(std::string_view body) {
  const auto parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return std::string("the body must be a JSON object");
  kv_pull_request pull;
  for (auto [name, field] : {std::pair{"remote_engine_id", &pull.remote_engine_id},
                             std::pair{"remote_request_id", &pull.remote_request_id}}) {
    const auto found = parsed.find(name);
    if (found == parsed.end() || !found->is_string()) return std::string(name) + " must be a string";
    *field = found->get<std::string>();
  }
  return pull;
}

std::string render_kv_pulled(const kv_pulled& pulled) {
  ordered_json body;
  body["blocks"] = pulled.blocks;
  body["prompt_tokens"] = pulled.prompt_tokens;
  return body.dump();
}

std::optional<kv_pulled> parse_kv_pulled(std::string_view body) {
  const auto parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
  const auto blocks = parsed.find("blocks");
  const auto tokens = parsed.find("prompt_tokens");
  if (blocks == parsed.end() || !blocks->is_number_unsigned() || tokens == parsed.end() ||
      !tokens->is_number_unsigned())
    return std::nullopt;
  return kv_pulled{blocks->get<std::uint64_t>(), tokens->get<std::uint64_t>()};
}

std::string kv_hold_table::key(std::string_view engine_id, std::string_view request_id) {
  // A NUL cannot occur in either id as they reach us (JSON strings may hold one, but then the pair
  // simply matches nothing a prefill made).
  std::string k(engine_id);
  k += '\0';
  k += request_id;
  return k;
}

void kv_hold_table::release(const held& h) {
  if (h.owner != nullptr)
    h.owner->kv_blocks_held.fetch_sub(static_cast<std::int64_t>(h.blocks), std::memory_order_relaxed);
}

kv_transfer_params kv_hold_table::hold(std::string_view engine_id, std::string_view id_base, std::uint64_t blocks,
                                       std::uint64_t prompt_tokens, engine_metrics* owner, clock::time_point now,
                                       std::function<void()> on_release) {
  kv_transfer_params params;
  params.do_remote_prefill = true;
  params.remote_engine_id = engine_id;
  params.remote_block_ids.reserve(blocks);
  const std::lock_guard lock(mutex_);
  params.remote_request_id = std::string(id_base) + "-kv" + std::to_string(next_suffix_++);
  for (std::uint64_t b = 0; b < blocks; ++b) params.remote_block_ids.push_back(next_block_id_++);
  holds_.emplace(key(engine_id, params.remote_request_id),
                 held{blocks, prompt_tokens, now + timeout_, owner, std::move(on_release)});
  blocks_held_ += blocks;
  if (owner != nullptr) owner->kv_blocks_held.fetch_add(static_cast<std::int64_t>(blocks), std::memory_order_relaxed);
  return params;
}

std::optional<kv_pulled> kv_hold_table::take(std::string_view engine_id, std::string_view request_id) {
  held h;
  {
    const std::lock_guard lock(mutex_);
    const auto found = holds_.find(key(engine_id, request_id));
    if (found == holds_.end()) return std::nullopt;
    h = std::move(found->second);
    holds_.erase(found);
    blocks_held_ -= h.blocks;
    release(h);
  }
  if (h.on_release) h.on_release();
  return kv_pulled{h.blocks, h.prompt_tokens};
}

std::size_t kv_hold_table::expire(clock::time_point now) {
  std::vector<std::function<void()>> releases;
  std::size_t expired = 0;
  {
    const std::lock_guard lock(mutex_);
    for (auto it = holds_.begin(); it != holds_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      blocks_held_ -= it->second.blocks;
      release(it->second);
      if (it->second.owner != nullptr) it->second.owner->kv_holds_expired.fetch_add(1, std::memory_order_relaxed);
      if (it->second.on_release) releases.push_back(std::move(it->second.on_release));
      it = holds_.erase(it);
      ++expired;
    }
  }
  for (const auto& on_release : releases) on_release();
  return expired;
}

std::uint64_t kv_hold_table::blocks_held() const {
  const std::lock_guard lock(mutex_);
  return blocks_held_;
}

std::size_t kv_hold_table::size() const {
  const std::lock_guard lock(mutex_);
  return holds_.size();
}

}  // namespace dplb::mock
