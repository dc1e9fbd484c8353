// The DeepSpeed config keys the translation knows (ds_config.cpp), as data:
// the ones it translates, the ones it accepts and ignores, the ones it
// accepts only at DeepSpeed's default, and the ones DeepSpeed 0.19 itself
// refuses (removed features), refused here with DeepSpeed's reason. One
// table for the translation's checks and for the list in docs/integrations.md.
#pragma once

#include <string_view>
#include <vector>

namespace zerod::scripting {

struct DsKey {
  enum Kind { kTranslated, kIgnored, kDefaultOnly, kRefusedByDeepSpeed };
  std::string_view key;    // dotted path; "section.*" is every key under section
  Kind kind;
  std::string_view value;  // kDefaultOnly: the one value accepted (JSON text)
  std::string_view note;   // kTranslated: what it becomes; otherwise why (kRefusedByDeepSpeed: DeepSpeed's why)
};

const std::vector<DsKey>& deepspeed_keys();
// The rule for a dotted key (a "section.*" entry covers its subkeys), or null.
const DsKey* find_deepspeed_key(std::string_view key);
// Known keys directly under `section` ("" for the top level), for "did you mean".
std::vector<std::string_view> deepspeed_keys_under(std::string_view section);

}  // namespace zerod::scripting
