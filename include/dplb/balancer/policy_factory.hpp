#pragma once
#include <memory>
#include <span>
#include <string_view>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// Every policy name dplb accepts, in the order --help lists them.
std::span<const std::string_view> policy_names() noexcept;

// Makes the policy with that name; nullptr for an unknown name (config validation reports it).
std::unique_ptr<policy> make_policy(std::string_view name);

}  // namespace dplb::balancer
