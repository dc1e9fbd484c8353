// Where each key of a job script's tables is written.
//
// Lua keeps no line numbers for table fields, so the script's text is
// tokenized and every `name = ...` / `["name"] = ...` field of a table
// constructor is recorded with the chain of constructor keys around it
// ("optimizer.lr" at line 5). Errors about a key then point at its line.
// A table built in a local (local opt = {lr = 1}) records "lr" alone; a
// lookup falls back to the longest recorded path that ends the key's path.
#pragma once

#include <string>
#include <vector>

namespace zerod::scripting {

class SourceMap {
 public:
  SourceMap() = default;
  explicit SourceMap(const std::string& text);

  // The line of the key (dotted path such as "optimizer.betas"), or 0.
  int line_of(const std::string& path) const;
  // The line of the script's last top-level `return`, or 0.
  int return_line() const { return return_line_; }

  struct Field {
    std::string path;
    int line;
  };
  const std::vector<Field>& fields() const { return fields_; }

 private:
  std::vector<Field> fields_;
  int return_line_ = 0;
};

}  // namespace zerod::scripting
