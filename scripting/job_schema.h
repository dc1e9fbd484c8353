// The engine's own job-script keys, declared as data: name, type, range,
// default and help, as plugins declare their hyperparameters
// (zd_hparam_spec). The reader (job_script.cpp) checks scripts against it,
// `zerod check --schema` prints it (docs/job-scripts.md's key table follows
// it), and the DeepSpeed translation
// (ds_config.cpp) leaves out what equals a default here. A default is
// written once: in this table.
#pragma once

#include "config_reader.h"

#include <string>
#include <string_view>
#include <vector>

namespace zerod::scripting {

enum class KeyType { kInteger, kNumber, kBoolean, kChoice, kString, kStrings, kSize, kTable, kFunction };

struct KeySpec {
  std::string_view key;       // full dotted path: "fp16.loss_scale"
  KeyType type;
  double def = 0;             // integers, numbers, booleans (0 / 1)
  std::string_view def_text;  // choices: the choice; sizes, strings: as shown; others: derived when empty
  NumberRange range{};        // integers and numbers
  std::vector<std::string_view> choices{};
  std::string_view help;

  // The last component of key: what the reader looks up in its table.
  std::string leaf() const;
  // The type column of the docs: `integer 0..3`, `"cpu" | "cuda"`, ...
  std::string type_text() const;
  // The default as the docs and `zerod check` show it.
  std::string default_text() const;
};

// Every key, in the order the docs list them.
const std::vector<KeySpec>& job_schema();
// The spec of one key; a key missing from the table is a bug in the caller
// (ZD_ERR_INTERNAL).
const KeySpec& job_key(std::string_view key);
// The schema as a Markdown table (the docs' "Settings" table).
std::string job_schema_markdown();

}  // namespace zerod::scripting
