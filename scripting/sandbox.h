// A Lua state for job scripts: an allow-listed environment (no os.execute,
// no io unless allowed, no bytecode, no dofile/loadfile), a capped allocator,
// an instruction budget, and a budget for the work Lua's library does inside
// C (pattern matching, string.rep, table.move/insert/remove), where the
// instruction budget cannot stop it, so a script cannot touch the machine or
// run away with it.
#pragma once

#include <lua.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace zerod::scripting {

struct SandboxLimits {
  size_t memory_bytes = size_t{64} << 20;       // the whole state
  uint64_t instructions = 200'000'000;          // per call into Lua
  // Steps (about a nanosecond each) of the library's work inside C per call
  // into Lua: each wrapped call's work is charged before it runs.
  uint64_t library_steps = 1'000'000'000;
  bool allow_io = false;
};

class Sandbox {
 public:
  explicit Sandbox(const SandboxLimits& limits);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  lua_State* L() const { return L_; }

  // Loads text as a chunk named chunkname ("@path" or "=name"), text only.
  // On failure returns false with the message (file:line: ...) in *error.
  bool load(const std::string& text, const std::string& chunkname, std::string* error);

  // lua_pcall with fresh instruction and library budgets and a traceback on
  // error.
  // On failure returns false with the message in *error.
  bool call(int nargs, int nresults, std::string* error);

  const SandboxLimits& limits() const { return limits_; }
  // Charges work the library is about to do inside C against this call's
  // library budget; false, charging nothing, when it would pass it.
  bool spend_library_steps(double steps);
  double library_steps_left() const { return library_steps_left_; }

 private:
  static void* alloc(void* ud, void* ptr, size_t osize, size_t nsize);
  static void count_hook(lua_State* L, lua_Debug* ar);
  void open_libraries();

  SandboxLimits limits_;
  size_t used_ = 0;
  uint64_t budget_left_ = 0;
  double library_steps_left_ = static_cast<double>(limits_.library_steps);
  lua_State* L_ = nullptr;
};

}  // namespace zerod::scripting
