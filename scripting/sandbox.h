// A Lua state for job scripts: an allow-listed environment (no os.execute,
// no io unless allowed, no bytecode, no dofile/loadfile), a capped allocator
// and an instruction budget, so a script cannot touch the machine or run
// away with it.
#pragma once

#include <lua.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace zerod::scripting {

struct SandboxLimits {
  size_t memory_bytes = size_t{64} << 20;       // the whole state
  uint64_t instructions = 200'000'000;          // per call into Lua
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

  // lua_pcall with a fresh instruction budget and a traceback on error.
  // On failure returns false with the message in *error.
  bool call(int nargs, int nresults, std::string* error);

 private:
  static void* alloc(void* ud, void* ptr, size_t osize, size_t nsize);
  static void count_hook(lua_State* L, lua_Debug* ar);
  void open_libraries();

  SandboxLimits limits_;
  size_t used_ = 0;
  uint64_t budget_left_ = 0;
  lua_State* L_ = nullptr;
};

}  // namespace zerod::scripting
