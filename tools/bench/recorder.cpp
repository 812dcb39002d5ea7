#include "recorder.hpp"

#include <nlohmann/json.hpp>

namespace dplb::loadgen {

response_recorder::response_recorder(request_result& result, body_kind kind, bool keep_answer)
    : result_(result), kind_(kind), keep_answer_(keep_answer) {
  // One allocation up front instead of a few as the gaps arrive.
  if (kind_ == body_kind::event_stream) result_.itl_s.reserve(result_.max_tokens);
}

double response_recorder::since_start(clock::time_point at) const {
  return std::chrono::duration<double>(at - result_.start).count();
}

void response_recorder::consume(std::string_view bytes, clock::time_point at) {
  switch (kind_) {
    case body_kind::event_stream:
      sse_.feed(bytes, [&](std::string_view data) { on_event(data, at); });
      break;
    case body_kind::json:
      if (text_.size() + bytes.size() > max_json_body) {
        text_truncated_ = true;
      } else {
        text_.append(bytes);
      }
      break;
    case body_kind::error_text:
      if (text_.size() < max_error_text) text_.append(bytes.substr(0, max_error_text - text_.size()));
      break;
  }
}

void response_recorder::on_event(std::string_view data, clock::time_point at) {
  const event_info info = inspect_event(data);
  if (info.done) {
    done_ = true;
    return;
  }
  // Events that arrived in one read share its time, so their gaps are 0, as in vllm bench serve.
  if (info.content) {
    if (result_.events == 0) {
      result_.ttft_s = since_start(at);
    } else {
      result_.itl_s.push_back(std::chrono::duration<double>(at - last_content_).count());
    }
    last_content_ = at;
    ++result_.events;
    if (keep_answer_) append_answer_text(data, result_.answer);
  }
  if (info.usage) {
    result_.has_usage = true;
    result_.prompt_tokens = info.usage->prompt_tokens;
    result_.completion_tokens = info.usage->completion_tokens;
  }
  if (info.error && inband_error_.empty()) {
    // Rare path: worth a real parse to report the server's own words.
    const auto json = nlohmann::json::parse(data, nullptr, false);
    std::string message = "in-band error";
    if (json.is_object()) {
      const auto& error = json.contains("error") && json["error"].is_object() ? json["error"] : json;
      if (error.contains("message") && error["message"].is_string()) message += ": " + error["message"].get<std::string>();
    }
    inband_error_ = std::move(message);
  }
}

void response_recorder::complete(clock::time_point at) {
  result_.e2e_s = since_start(at);
  result_.ok = false;
  switch (kind_) {
    case body_kind::event_stream:
      if (sse_.overflowed()) {
        result_.error = "an SSE line exceeded the reader's limit";
      } else if (!inband_error_.empty()) {
        result_.error = inband_error_;
      } else if (!done_) {
        result_.error = "stream ended without data: [DONE]";
      } else if (result_.events == 0) {
        result_.error = "stream had no content event before [DONE]";
      } else {
        result_.ok = true;
      }
      return;
    case body_kind::json: {
      if (text_truncated_) {
        result_.error = "response body larger than 64 MiB";
        return;
      }
      const auto json = nlohmann::json::parse(text_, nullptr, false);
      if (!json.is_object()) {
        result_.error = "response body is not a JSON object";
        return;
      }
      if (json.contains("error")) {
        result_.error = "error object in a 200 response";
        return;
      }
      const auto usage = json.find("usage");
      if (usage != json.end() && usage->is_object()) {
        result_.has_usage = true;
        result_.prompt_tokens = usage->value("prompt_tokens", std::uint64_t{0});
        result_.completion_tokens = usage->value("completion_tokens", std::uint64_t{0});
      }
      const auto choices = json.find("choices");
      if (choices == json.end() || !choices->is_array() || choices->empty()) {
        result_.error = "response has no choices";
        return;
      }
      if (keep_answer_) append_answer_text(text_, result_.answer);
      // Without a stream the first token is seen with the last, as vllm bench serve counts it.
      result_.events = 1;
      result_.ttft_s = result_.e2e_s;
      result_.ok = true;
      return;
    }
    case body_kind::error_text: {
      std::string text = text_;
      for (char& c : text) {
        if (c == '\r' || c == '\n') c = ' ';
      }
      result_.error = "HTTP " + std::to_string(result_.status) + (text.empty() ? "" : ": " + text);
      return;
    }
  }
}

void response_recorder::fail(clock::time_point at, const std::string& why) {
  result_.e2e_s = since_start(at);
  result_.ok = false;
  if (kind_ == body_kind::event_stream) {
    result_.error = why + (done_ ? " after [DONE]" : result_.events == 0 ? " before the first token" : " mid-stream");
  } else {
    result_.error = why;
  }
}

}  // namespace dplb::loadgen
