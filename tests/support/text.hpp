#pragma once
// Small text helpers shared by the test support's HTTP readers (the client's response splitter and the raw
// engine's request parser), and the prompts of the prefix tests.

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace dplb::test {

// ASCII case-insensitive equality, as HTTP field names compare.
inline bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Without the optional whitespace (spaces and tabs) around a field value.
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A long prompt prefix of its own for each group: 2,000 bytes, about 500 tokens (7 of dplb's 256-byte
// prefix blocks), so that requests of one group share whole blocks and groups share none.
inline std::string group_prefix(int group) {
  std::string text;
  for (int i = 0; text.size() < 2000; ++i) text += "g" + std::to_string(group) + "w" + std::to_string(i) + " ";
  return text;
}

}  // namespace dplb::test
