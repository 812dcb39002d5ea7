#pragma once
// The admin token's file (--admin-token-file), read at start-up and again on SIGHUP.

#include <string>

namespace dplb::config {

// The token the file holds, trimmed of surrounding whitespace. Throws config_error (settings.hpp) with
// the reason when the file cannot be read or holds only whitespace.
std::string read_admin_token_file(const std::string& path);

// Why the file exposes the token: some permission for its group or for others (the token lets anyone
// drain and remove backends, so only its owner should read it, as ssh requires of a private key). ""
// when only the owner has access, or when the file cannot be examined (reading it then says why).
std::string admin_token_file_exposure(const std::string& path);

}  // namespace dplb::config
