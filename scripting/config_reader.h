// Reads a job script's returned table against a typed schema written in
// C++. Every problem is collected — unknown keys (with a suggestion), wrong
// types, values out of range — each named by its full key and the file:line
// where the script wrote it; the caller refuses the load if there is any.
// Each value read is also recorded, resolved, for `zerod check`. Reading runs
// the script's metamethods under a protected call (lua_protect.h); one that
// fails ends the read with ZD_ERR_CONFIG naming the key.
#pragma once

#include "source_map.h"

#include <lua.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace zerod::scripting {

struct ConfigIssue {
  int line = 0;
  std::string message;  // "optimizer.lr: must be > 0, got -1"
};

struct ResolvedValue {
  std::string key;    // full dotted path
  std::string value;  // as Lua would write it
  int line = 0;       // 0 when the default was used
};

struct NumberRange {
  double min = -1e308;
  double max = 1e308;
  bool min_exclusive = false;
  bool max_exclusive = false;
  bool integer = false;
};

struct KeySpec;  // job_schema.h

// Shortest decimal text that reads back as the same double.
std::string format_number(double v);

class ConfigReader {
 public:
  // The table to read is at stack index root (absolute).
  ConfigReader(lua_State* L, int root, const SourceMap* map, std::string source);

  // Opens the sub-table at key. False when it is absent (and not required)
  // or is not a table (an issue is recorded); then there is nothing to leave.
  bool enter(const std::string& key, bool required = false);
  // Opens an empty table in place of the absent one at key, so that the
  // reads that follow record its keys' defaults as `key = {}` would (zerod
  // check lists a table the script leaves out); leave() closes it.
  void enter_absent(const std::string& key);
  // Closes the innermost table, reporting its unknown keys.
  void leave();
  // Reports the root table's unknown keys. Call once at the end.
  void finish();
  // Treats every key of the current table as known: used when the schema for
  // it cannot be had (the plugin that defines it failed to load), so the
  // one real error is not buried under "unknown key" noise.
  void accept_all();

  bool present(const std::string& key);
  double number(const std::string& key, double def, const NumberRange& range);
  int64_t integer(const std::string& key, int64_t def, int64_t min, int64_t max);
  bool boolean(const std::string& key, bool def);
  std::string choice(const std::string& key, const std::string& def,
                     const std::vector<std::string>& choices);
  std::optional<std::string> string(const std::string& key, bool required);
  // The same four, with the key's leaf name, default and range taken from
  // its declaration in the schema (job_schema.h).
  double number(const KeySpec& k);
  int64_t integer(const KeySpec& k);
  bool boolean(const KeySpec& k);
  std::string choice(const KeySpec& k);
  // A byte count: a number or a size literal ("512MiB"). nullopt when absent,
  // recorded as absent_text (a key with a default gives it here).
  std::optional<uint64_t> size(const std::string& key, const std::string& absent_text = "none");
  // A string or a list of strings.
  std::vector<std::string> strings(const std::string& key);
  // A function, kept in the registry: its ref, or LUA_NOREF when absent.
  // *where is its file:line. If the global zerod table has a function named
  // `describer` that returns a string for it (a library schedule), that is
  // the value recorded.
  int function(const std::string& key, std::string* where, const char* describer = nullptr);
  // A number, or a list of exactly `count` numbers when count > 1.
  std::vector<double> numbers(const std::string& key, int count, const std::vector<double>& defs,
                              const NumberRange& range, bool boolean);

  // Records a problem with a key of the current table (or the table itself
  // when key is empty).
  void issue(const std::string& key, const std::string& message);
  // Records that a key was given a value the reader did not read itself.
  void note(const std::string& key, const std::string& value, bool from_script);

  std::string path(const std::string& key) const;
  int line(const std::string& key) const;
  const std::vector<ConfigIssue>& issues() const { return issues_; }
  const std::vector<ResolvedValue>& resolved() const { return resolved_; }
  // Rewrites every issue's line through to[line] (a script made from
  // another file, e.g. a DeepSpeed JSON config, reports the original's).
  void remap_lines(const std::vector<int>& to);
  // All issues, sorted by line, one per line as "source:line: message".
  std::string report() const;

 private:
  struct Scope {
    std::string path;
    int index;               // absolute stack index of the table
    std::set<std::string> known;
  };
  // Pushes t[key]; returns its Lua type. A Lua error while reading it (the
  // table's __index metamethod, the memory cap) throws ZD_ERR_CONFIG.
  int get(const std::string& key);
  // "file:line: full.key", for an error that ends the read.
  std::string place_of(const std::string& key) const;
  void check_unknown(const Scope& s);
  // Whether the table at the top of the stack is a list (keys 1..#t only);
  // if not, an issue names the first other entry.
  bool is_list(const std::string& key);
  void record(const std::string& key, const std::string& value, bool from_script);

  lua_State* L_;
  const SourceMap* map_;
  std::string source_;
  std::vector<Scope> scopes_;
  std::vector<ConfigIssue> issues_;
  std::vector<ResolvedValue> resolved_;
};

}  // namespace zerod::scripting
