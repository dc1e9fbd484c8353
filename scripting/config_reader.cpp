#include "config_reader.h"

#include <zerod/kit/text.h>

#include "job_schema.h"
#include "lua_protect.h"
#include "size.h"

#include "error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace zerod::scripting {

namespace {

std::string type_word(lua_State* L, int index) {
  return lua_typename(L, lua_type(L, index));
}

// A table key as a script writes it: 'name', [2] or "a boolean key".
std::string key_text(lua_State* L, int index) {
  switch (lua_type(L, index)) {
    case LUA_TSTRING: return "'" + std::string(lua_tostring(L, index)) + "'";
    case LUA_TNUMBER: return "[" + format_number(lua_tonumber(L, index)) + "]";
    default: return "a " + type_word(L, index) + " key";
  }
}

}  // namespace

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // whole numbers as such, not 5e+01
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

ConfigReader::ConfigReader(lua_State* L, int root, const SourceMap* map, std::string source)
    : L_(L), map_(map), source_(std::move(source)) {
  scopes_.push_back(Scope{"", root, {}});
}

std::string ConfigReader::path(const std::string& key) const {
  const std::string& base = scopes_.back().path;
  if (key.empty()) return base;
  return base.empty() ? key : base + "." + key;
}

int ConfigReader::line(const std::string& key) const {
  const std::string p = path(key);
  int l = p.empty() ? 0 : map_->line_of(p);
  // A key the script does not write: point at its table, else the return.
  for (std::string q = p; l == 0 && !q.empty();) {
    const auto dot = q.rfind('.');
    q = dot == std::string::npos ? "" : q.substr(0, dot);
    if (!q.empty()) l = map_->line_of(q);
  }
  return l ? l : map_->return_line();
}

std::string ConfigReader::place_of(const std::string& key) const {
  const int l = line(key);
  return source_ + (l ? ":" + std::to_string(l) : std::string()) + ": " + path(key);
}

void ConfigReader::issue(const std::string& key, const std::string& message) {
  const std::string p = path(key);
  issues_.push_back({line(key), (p.empty() ? "" : p + ": ") + message});
}

void ConfigReader::record(const std::string& key, const std::string& value, bool from_script) {
  // A key two readers share (comm.timeout: the engine's and the mpi
  // plugin's) is listed once.
  const std::string p = path(key);
  for (const ResolvedValue& v : resolved_)
    if (v.key == p) return;
  resolved_.push_back({p, value, from_script ? line(key) : 0});
}

void ConfigReader::note(const std::string& key, const std::string& value, bool from_script) {
  scopes_.back().known.insert(key);
  record(key, value, from_script);
}

int ConfigReader::get(const std::string& key) {
  scopes_.back().known.insert(key);
  // Protected: the table's __index metamethod runs here, and the key's
  // string is allocated in the capped state (lua_protect.h says why).
  const int table = scopes_.back().index;
  std::string err;
  const int rc = protected_call(L_, table, 1, [&key](lua_State* L) {
    lua_getfield(L, 1, key.c_str());
    return 1;
  }, &err);
  if (rc != LUA_OK) {
    const bool meta = lua_getmetatable(L_, table) != 0;
    if (meta) lua_pop(L_, 1);
    const std::string how = rc == LUA_ERRMEM ? "ran out of memory: " + err
                            : meta ? "ran the table's __index metamethod, which failed: " + err
                                   : "failed: " + err;
    fail(ZD_ERR_CONFIG, place_of(key) + ": reading it " + how);
  }
  return lua_type(L_, -1);
}

bool ConfigReader::present(const std::string& key) {
  const int t = get(key);
  lua_pop(L_, 1);
  return t != LUA_TNIL;
}

bool ConfigReader::enter(const std::string& key, bool required) {
  const int t = get(key);
  if (t == LUA_TTABLE) {
    scopes_.push_back(Scope{path(key), lua_gettop(L_), {}});
    return true;
  }
  if (t == LUA_TNIL) {
    if (required) issue(key, "is required (a table)");
  } else {
    issue(key, "must be a table, got a " + type_word(L_, -1));
  }
  lua_pop(L_, 1);
  return false;
}

void ConfigReader::enter_absent(const std::string& key) {
  // The new table is allocated in the script's capped state: protected, as get() is.
  std::string err;
  const int rc = protected_call(L_, 0, 1, [](lua_State* L) {
    lua_newtable(L);
    return 1;
  }, &err);
  if (rc != LUA_OK) fail(ZD_ERR_CONFIG, place_of(key) + ": reading its defaults failed: " + err);
  scopes_.push_back(Scope{path(key), lua_gettop(L_), {}});
}

void ConfigReader::check_unknown(const Scope& s) {
  lua_pushnil(L_);
  while (lua_next(L_, s.index) != 0) {
    lua_pop(L_, 1);  // the value
    if (lua_type(L_, -1) != LUA_TSTRING) {
      const std::string k = key_text(L_, -1);
      issues_.push_back({s.path.empty() ? map_->return_line() : map_->line_of(s.path),
                         (s.path.empty() ? std::string("the job table") : s.path) +
                             ": unexpected list entry " + k + "; settings are named keys"});
      continue;
    }
    const std::string k = lua_tostring(L_, -1);
    if (s.known.count(k)) continue;
    std::string best;
    size_t best_d = 3;
    for (const auto& cand : s.known) {
      const size_t d = edit_distance(k, cand);
      if (d < best_d && d <= std::max<size_t>(1, cand.size() / 3)) {
        best_d = d;
        best = cand;
      }
    }
    const std::string full = s.path.empty() ? k : s.path + "." + k;
    const std::string hint = best.empty() ? "" : " (did you mean '" +
                                                     (s.path.empty() ? best : s.path + "." + best) +
                                                     "'?)";
    int l = map_->line_of(full);
    issues_.push_back({l ? l : map_->return_line(), "unknown key '" + full + "'" + hint});
  }
}

void ConfigReader::leave() {
  check_unknown(scopes_.back());
  lua_settop(L_, scopes_.back().index - 1);
  scopes_.pop_back();
}

void ConfigReader::finish() { check_unknown(scopes_.front()); }

void ConfigReader::accept_all() {
  Scope& s = scopes_.back();
  lua_pushnil(L_);
  while (lua_next(L_, s.index) != 0) {
    lua_pop(L_, 1);
    if (lua_type(L_, -1) == LUA_TSTRING) s.known.insert(lua_tostring(L_, -1));
  }
}

bool ConfigReader::is_list(const std::string& key) {
  // Raw: no metamethod runs, and lua_next allocates nothing.
  const auto n = static_cast<lua_Integer>(lua_rawlen(L_, -1));
  lua_pushnil(L_);
  while (lua_next(L_, -2) != 0) {
    lua_pop(L_, 1);  // the value
    if (!lua_isinteger(L_, -1) || lua_tointeger(L_, -1) < 1 || lua_tointeger(L_, -1) > n) {
      // The unknown-key rule holds inside a list too: betas = {0.9, 0.99, x = 1} is a mistake.
      issue(key, "unexpected entry " + key_text(L_, -1) + " in a list; it takes elements 1 to " +
                     std::to_string(n) + " only");
      lua_pop(L_, 1);  // the key
      return false;
    }
  }
  return true;
}

double ConfigReader::number(const std::string& key, double def, const NumberRange& range) {
  return numbers(key, 1, {def}, range, false).at(0);
}

int64_t ConfigReader::integer(const std::string& key, int64_t def, int64_t min, int64_t max) {
  NumberRange r;
  r.min = static_cast<double>(min);
  r.max = static_cast<double>(max);
  r.integer = true;
  return static_cast<int64_t>(numbers(key, 1, {static_cast<double>(def)}, r, false).at(0));
}

bool ConfigReader::boolean(const std::string& key, bool def) {
  return numbers(key, 1, {def ? 1.0 : 0.0}, NumberRange{}, true).at(0) != 0.0;
}

double ConfigReader::number(const KeySpec& k) { return number(k.leaf(), k.def, k.range); }

int64_t ConfigReader::integer(const KeySpec& k) {
  return integer(k.leaf(), static_cast<int64_t>(k.def), static_cast<int64_t>(k.range.min),
                 static_cast<int64_t>(std::min(k.range.max, 0x1p62)));
}

bool ConfigReader::boolean(const KeySpec& k) { return boolean(k.leaf(), k.def != 0); }

std::string ConfigReader::choice(const KeySpec& k) {
  return choice(k.leaf(), std::string(k.def_text), std::vector<std::string>(k.choices.begin(), k.choices.end()));
}

void ConfigReader::remap_lines(const std::vector<int>& to) {
  for (ConfigIssue& i : issues_)
    i.line = i.line > 0 && static_cast<size_t>(i.line) < to.size() ? to[static_cast<size_t>(i.line)] : 0;
}

std::vector<double> ConfigReader::numbers(const std::string& key, int count,
                                          const std::vector<double>& defs, const NumberRange& range,
                                          bool boolean) {
  const int t = get(key);
  std::vector<double> out(defs.begin(), defs.end());
  out.resize(static_cast<size_t>(count), 0.0);
  auto as_text = [&](const std::vector<double>& v) {
    auto one = [&](double x) { return boolean ? std::string(x != 0 ? "true" : "false") : format_number(x); };
    if (count == 1) return one(v[0]);
    std::string s = "{";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + one(v[i]);
    return s + "}";
  };
  const std::string want = boolean ? "a boolean" : range.integer ? "an integer" : "a number";
  if (t == LUA_TNIL) {
    lua_pop(L_, 1);
    record(key, as_text(out), false);
    return out;
  }
  // Reads the value at the top of the stack into v; false (issue recorded) if bad.
  auto read_one = [&](const std::string& label, double* v) {
    if (boolean) {
      if (!lua_isboolean(L_, -1)) {
        issue(key, label + "must be " + want + ", got a " + type_word(L_, -1));
        return false;
      }
      *v = lua_toboolean(L_, -1) ? 1.0 : 0.0;
      return true;
    }
    if (lua_type(L_, -1) != LUA_TNUMBER) {
      issue(key, label + "must be " + want + ", got a " + type_word(L_, -1));
      return false;
    }
    const double x = lua_tonumber(L_, -1);
    std::string bad;
    if (std::isnan(x)) bad = "must be a number, got nan";
    else if (range.integer && x != std::floor(x)) bad = "must be a whole number, got " + format_number(x);
    else if (range.min_exclusive ? !(x > range.min) : !(x >= range.min))
      bad = std::string("must be ") + (range.min_exclusive ? "> " : ">= ") + format_number(range.min) +
            ", got " + format_number(x);
    else if (range.max_exclusive ? !(x < range.max) : !(x <= range.max))
      bad = std::string("must be ") + (range.max_exclusive ? "< " : "<= ") + format_number(range.max) +
            ", got " + format_number(x);
    if (!bad.empty()) {
      issue(key, label + bad);
      return false;
    }
    *v = x;
    return true;
  };
  bool ok = true;
  if (count == 1) {
    ok = read_one("", &out[0]);
  } else if (t != LUA_TTABLE) {
    issue(key, "must be a list of " + std::to_string(count) + " numbers, got a " + type_word(L_, -1));
    ok = false;
  } else if (!is_list(key)) {
    ok = false;
  } else {
    const auto n = static_cast<int>(lua_rawlen(L_, -1));
    if (n != count) {
      issue(key, "must be a list of " + std::to_string(count) + " numbers, got " +
                     std::to_string(n));
      ok = false;
    } else {
      for (int i = 1; i <= count && ok; ++i) {
        lua_rawgeti(L_, -1, i);
        ok = read_one("element " + std::to_string(i) + " ", &out[static_cast<size_t>(i - 1)]);
        lua_pop(L_, 1);
      }
    }
  }
  lua_pop(L_, 1);
  if (!ok) {
    out.assign(defs.begin(), defs.end());
    out.resize(static_cast<size_t>(count), 0.0);
  }
  record(key, as_text(out), ok);
  return out;
}

std::string ConfigReader::choice(const std::string& key, const std::string& def,
                                 const std::vector<std::string>& choices) {
  const int t = get(key);
  std::string v = def;
  bool from_script = false;
  if (t == LUA_TSTRING) {
    const std::string s = lua_tostring(L_, -1);
    if (std::find(choices.begin(), choices.end(), s) != choices.end()) {
      v = s;
      from_script = true;
    } else {
      std::string list;
      for (const auto& c : choices) list += (list.empty() ? "\"" : ", \"") + c + "\"";
      issue(key, "must be one of " + list + ", got \"" + s + "\"");
    }
  } else if (t != LUA_TNIL) {
    issue(key, "must be a string, got a " + type_word(L_, -1));
  }
  lua_pop(L_, 1);
  record(key, "\"" + v + "\"", from_script);
  return v;
}

std::optional<std::string> ConfigReader::string(const std::string& key, bool required) {
  const int t = get(key);
  std::optional<std::string> v;
  if (t == LUA_TSTRING) {
    v = lua_tostring(L_, -1);
  } else if (t == LUA_TNIL) {
    if (required) issue(key, "is required (a string)");
  } else {
    issue(key, "must be a string, got a " + type_word(L_, -1));
  }
  lua_pop(L_, 1);
  if (v) record(key, "\"" + *v + "\"", true);
  return v;
}

std::optional<uint64_t> ConfigReader::size(const std::string& key, const std::string& absent_text) {
  const int t = get(key);
  std::optional<uint64_t> v;
  if (t == LUA_TNUMBER) {
    const double x = lua_tonumber(L_, -1);
    if (x < 0 || x != std::floor(x) || x >= 0x1p63)
      issue(key, "must be a whole number of bytes >= 0, got " + format_number(x));
    else
      v = static_cast<uint64_t>(x);
  } else if (t == LUA_TSTRING) {
    const std::string s = lua_tostring(L_, -1);
    const SizeReading size = read_size(s);
    v = size.bytes;
    if (!v) issue(key, "bad size \"" + s + "\": " + size.why_not);
  } else if (t != LUA_TNIL) {
    issue(key, "must be a size (bytes, or a string such as \"4GiB\"), got a " + type_word(L_, -1));
  }
  lua_pop(L_, 1);
  record(key, v ? std::to_string(*v) : absent_text, v.has_value());
  return v;
}

std::vector<std::string> ConfigReader::strings(const std::string& key) {
  const int t = get(key);
  std::vector<std::string> out;
  if (t == LUA_TSTRING) {
    out.push_back(lua_tostring(L_, -1));
  } else if (t == LUA_TTABLE && is_list(key)) {
    const auto n = static_cast<int>(lua_rawlen(L_, -1));
    for (int i = 1; i <= n; ++i) {
      lua_rawgeti(L_, -1, i);
      if (lua_type(L_, -1) == LUA_TSTRING)
        out.push_back(lua_tostring(L_, -1));
      else
        issue(key, "element " + std::to_string(i) + " must be a string, got a " + type_word(L_, -1));
      lua_pop(L_, 1);
    }
  } else if (t != LUA_TNIL && t != LUA_TTABLE) {
    issue(key, "must be a string or a list of strings, got a " + type_word(L_, -1));
  }
  lua_pop(L_, 1);
  std::string text = "{";
  for (size_t i = 0; i < out.size(); ++i) text += (i ? ", \"" : "\"") + out[i] + "\"";
  record(key, text + "}", t != LUA_TNIL);
  return out;
}

int ConfigReader::function(const std::string& key, std::string* where, const char* describer) {
  const int t = get(key);
  if (t == LUA_TNIL) {
    lua_pop(L_, 1);
    return LUA_NOREF;
  }
  if (t != LUA_TFUNCTION) {
    issue(key, "must be a function, got a " + type_word(L_, -1));
    lua_pop(L_, 1);
    return LUA_NOREF;
  }
  lua_Debug ar;
  lua_pushvalue(L_, -1);
  lua_getinfo(L_, ">S", &ar);
  *where = std::string(ar.short_src) + ":" + std::to_string(ar.linedefined);
  std::string text = "function defined at " + *where;
  std::string err;
  if (describer) {
    // A description is a nicety: when the script has replaced the global
    // `zerod` (zerod = 5), or looking it up or describing fails, the
    // function is named by where it is defined. Protected: the lookups run
    // the script's metamethods (lua_protect.h).
    const int top = lua_gettop(L_);
    const int rc = protected_call(L_, top, 1, [describer](lua_State* L) {
      if (lua_getglobal(L, "zerod") != LUA_TTABLE || lua_getfield(L, -1, describer) != LUA_TFUNCTION) return 0;
      lua_pushvalue(L, 1);
      lua_call(L, 1, 1);
      return 1;
    }, &err);
    if (rc == LUA_OK && lua_type(L_, -1) == LUA_TSTRING) text = lua_tostring(L_, -1);
    lua_settop(L_, top);
  }
  record(key, text, true);
  // Protected: the registry's table may grow, in the capped state.
  int ref = LUA_NOREF;
  const int rc = protected_call(L_, -1, 0, [&ref](lua_State* L) {
    ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
  }, &err);
  lua_pop(L_, 1);
  if (rc != LUA_OK) fail(ZD_ERR_CONFIG, place_of(key) + ": cannot keep the function: " + err);
  return ref;
}

std::string ConfigReader::report() const {
  std::vector<ConfigIssue> sorted = issues_;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const ConfigIssue& a, const ConfigIssue& b) { return a.line < b.line; });
  std::string out;
  for (const auto& i : sorted) {
    if (!out.empty()) out += "\n";
    out += source_ + (i.line ? ":" + std::to_string(i.line) : std::string()) + ": " + i.message;
  }
  return out;
}

}  // namespace zerod::scripting
