#include "dplb/http/error_response.hpp"

#include <nlohmann/json.hpp>

namespace dplb::http {

std::string_view error_type_for(unsigned status) noexcept {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 408: return "RequestTimeoutError";
    case 413: return "RequestEntityTooLargeError";
    case 429: return "RateLimitError";
    case 431: return "RequestHeaderFieldsTooLargeError";
    case 501: return "NotImplementedError";
    case 502: return "BadGatewayError";
    case 503: return "ServiceUnavailableError";
    case 504: return "GatewayTimeoutError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

std::string error_body(unsigned status, std::string_view message, std::string_view param, std::string_view code) {
  nlohmann::ordered_json body;
  body["error"]["message"] = message;
  body["error"]["type"] = error_type_for(status);
  if (param.empty()) {
    body["error"]["param"] = nullptr;
  } else {
    body["error"]["param"] = param;
  }
  if (code.empty()) {
    body["error"]["code"] = status;
  } else {
    body["error"]["code"] = code;
  }
  return body.dump();
}

}  // namespace dplb::http
