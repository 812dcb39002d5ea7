#pragma once
// Every response dplb makes itself uses the OpenAI/vLLM error shape, so SDK clients surface the message:
// {"error":{"message":"...","type":"...","param":null,"code":N}}

#include <string>
#include <string_view>

namespace dplb::http {

// The OpenAI error type for a status (BadRequestError, NotFoundError, ServiceUnavailableError, ...).
std::string_view error_type_for(unsigned status) noexcept;

// The JSON body, with the message escaped properly. `param` names the request field at fault (vLLM's
// unknown model: "model"); empty, it is null. `code`: a string code where one says more than the status
// (OpenAI's own, e.g. "request_too_large"); empty, the code is the status.
std::string error_body(unsigned status, std::string_view message, std::string_view param = {},
                       std::string_view code = {});

}  // namespace dplb::http
