#include "sandbox.h"

#include "zerod_lib.h"

#include "error.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace zerod::scripting {

namespace {

constexpr int kHookEvery = 10000;  // instructions between budget checks

// Registry key under which the Sandbox* is kept for the hook.
char kSandboxKey;

int text_only_load(lua_State* L) {
  // load(chunk [, chunkname [, mode [, env]]]) with mode forced to "t": no bytecode.
  size_t len = 0;
  const char* chunk = luaL_checklstring(L, 1, &len);
  const char* name = luaL_optstring(L, 2, "=(load)");
  const bool has_env = !lua_isnoneornil(L, 4);
  if (luaL_loadbufferx(L, chunk, len, name, "t") != LUA_OK) {
    luaL_pushfail(L);
    lua_insert(L, -2);
    return 2;
  }
  if (has_env) {
    lua_pushvalue(L, 4);
    if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
  }
  return 1;
}

int zerod_require(lua_State* L) {
  const char* name = luaL_checkstring(L, 1);
  if (std::strcmp(name, "zerod") != 0)
    return luaL_error(L, "require('%s'): job scripts may only require 'zerod'", name);
  lua_getglobal(L, "zerod");
  return 1;
}

void keep_only(lua_State* L, const char* lib, std::initializer_list<const char*> keep) {
  lua_getglobal(L, lib);
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  lua_newtable(L);
  for (const char* name : keep) {
    lua_getfield(L, -2, name);
    lua_setfield(L, -2, name);
  }
  lua_setglobal(L, lib);
  lua_pop(L, 1);
}

// Lua's pattern matching runs inside C, where the instruction budget's hook
// never fires: s:find(".-.-.-b") over 5000 bytes backtracks for hours. A
// pattern with k repetitions (*, +, -, outside sets and escapes) over n
// bytes takes at most about n^(k+1) steps; beyond kPatternSteps the call is
// refused, naming both. Job scripts match names, far below it.
constexpr double kPatternSteps = 1e9;

int repetitions(const char* p, size_t len) {
  int k = 0;
  for (size_t i = 0; i < len; ++i) {
    if (p[i] == '%') {
      ++i;  // an escaped character, or a class: not a repetition
    } else if (p[i] == '[') {
      // A set: '-' there is a range. Its first ']' (or '^]') is a member.
      ++i;
      if (i < len && p[i] == '^') ++i;
      if (i < len && p[i] == ']') ++i;
      for (; i < len && p[i] != ']'; ++i)
        if (p[i] == '%') ++i;
    } else if (p[i] == '*' || p[i] == '+' || p[i] == '-') {
      ++k;
    }
  }
  return k;
}

// string.find/match/gmatch/gsub with the bound above; the original is the
// closure's upvalue. find with `plain` searches without a pattern.
int bounded_pattern_call(lua_State* L) {
  size_t n = 0, plen = 0;
  const char* name = lua_tostring(L, lua_upvalueindex(2));
  if (lua_type(L, 1) == LUA_TSTRING || lua_type(L, 1) == LUA_TNUMBER) lua_tolstring(L, 1, &n);
  const char* pattern = (lua_type(L, 2) == LUA_TSTRING || lua_type(L, 2) == LUA_TNUMBER)
                            ? lua_tolstring(L, 2, &plen)
                            : nullptr;
  const bool plain = std::strcmp(name, "find") == 0 && lua_toboolean(L, 4);
  if (pattern && !plain) {
    const int k = repetitions(pattern, plen);
    if (k > 0 && std::pow(static_cast<double>(n) + 1, k + 1) > kPatternSteps)
      return luaL_error(L, "string.%s: a pattern with %d repetitions over a %d-byte string could run for hours "
                           "inside Lua's matcher, where the script's instruction budget cannot stop it; use fewer "
                           "repetitions (*, +, -) or a shorter string",
                        name, k, static_cast<int>(std::min<size_t>(n, 0x7fffffff)));
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

}  // namespace

void* Sandbox::alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* self = static_cast<Sandbox*>(ud);
  if (ptr == nullptr) osize = 0;
  if (nsize == 0) {
    std::free(ptr);
    self->used_ -= osize;
    return nullptr;
  }
  if (nsize > osize && self->used_ + (nsize - osize) > self->limits_.memory_bytes) return nullptr;
  void* p = std::realloc(ptr, nsize);
  if (p) self->used_ = self->used_ - osize + nsize;
  return p;
}

void Sandbox::count_hook(lua_State* L, lua_Debug*) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &kSandboxKey);
  auto* self = static_cast<Sandbox*>(lua_touserdata(L, -1));
  lua_pop(L, 1);
  if (self->budget_left_ <= kHookEvery) {
    // From now on at every instruction, on this thread and the coroutines
    // it makes, until the next call: a pcall around the loop catches this
    // error, but the first instruction after it raises the next one, so
    // the outermost code cannot run on either.
    lua_sethook(L, &Sandbox::count_hook, LUA_MASKCOUNT, 1);
    luaL_error(L, "the script ran more than %d million instructions in one call "
                  "(an endless loop?)",
               static_cast<int>(self->limits_.instructions / 1000000));
  }
  self->budget_left_ -= kHookEvery;
}

Sandbox::Sandbox(const SandboxLimits& limits) : limits_(limits) {
  L_ = lua_newstate(&Sandbox::alloc, this);
  if (!L_) fail(ZD_ERR_OUT_OF_MEMORY, "cannot create a Lua state for the job script");
  lua_pushlightuserdata(L_, this);
  lua_rawsetp(L_, LUA_REGISTRYINDEX, &kSandboxKey);
  open_libraries();
  lua_sethook(L_, &Sandbox::count_hook, LUA_MASKCOUNT, kHookEvery);
}

Sandbox::~Sandbox() {
  if (L_) lua_close(L_);
}

void Sandbox::open_libraries() {
  luaL_requiref(L_, LUA_GNAME, luaopen_base, 1);
  luaL_requiref(L_, LUA_TABLIBNAME, luaopen_table, 1);
  luaL_requiref(L_, LUA_STRLIBNAME, luaopen_string, 1);
  luaL_requiref(L_, LUA_MATHLIBNAME, luaopen_math, 1);
  luaL_requiref(L_, LUA_UTF8LIBNAME, luaopen_utf8, 1);
  luaL_requiref(L_, LUA_COLIBNAME, luaopen_coroutine, 1);
  luaL_requiref(L_, LUA_OSLIBNAME, luaopen_os, 1);
  if (limits_.allow_io) luaL_requiref(L_, LUA_IOLIBNAME, luaopen_io, 1);
  lua_settop(L_, 0);

  // Nothing that reaches files or runs programs, and no bytecode.
  for (const char* name : {"dofile", "loadfile", "collectgarbage"}) {
    lua_pushnil(L_);
    lua_setglobal(L_, name);
  }
  lua_pushcfunction(L_, text_only_load);
  lua_setglobal(L_, "load");
  keep_only(L_, LUA_OSLIBNAME, {"clock", "date", "difftime", "getenv", "time"});
  lua_getglobal(L_, LUA_STRLIBNAME);
  lua_pushnil(L_);
  lua_setfield(L_, -2, "dump");
  // The string table is also strings' metatable's __index: s:find(...) too.
  for (const char* fn : {"find", "match", "gmatch", "gsub"}) {
    lua_getfield(L_, -1, fn);
    lua_pushstring(L_, fn);
    lua_pushcclosure(L_, bounded_pattern_call, 2);
    lua_setfield(L_, -2, fn);
  }
  lua_pop(L_, 1);

  open_zerod_library(L_);
  lua_setglobal(L_, "zerod");
  lua_pushcfunction(L_, zerod_require);
  lua_setglobal(L_, "require");
}

bool Sandbox::load(const std::string& text, const std::string& chunkname, std::string* error) {
  if (luaL_loadbufferx(L_, text.data(), text.size(), chunkname.c_str(), "t") != LUA_OK) {
    *error = lua_tostring(L_, -1) ? lua_tostring(L_, -1) : "cannot load the script";
    lua_pop(L_, 1);
    return false;
  }
  return true;
}

bool Sandbox::call(int nargs, int nresults, std::string* error) {
  budget_left_ = limits_.instructions;
  lua_sethook(L_, &Sandbox::count_hook, LUA_MASKCOUNT, kHookEvery);
  const int base = lua_gettop(L_) - nargs;
  lua_pushcfunction(L_, [](lua_State* L) -> int {
    const char* msg = lua_tostring(L, 1);
    // Only the first line of a traceback is kept: it has file:line already.
    lua_pushstring(L, msg ? msg : "(error object is not a string)");
    return 1;
  });
  lua_insert(L_, base);
  const int rc = lua_pcall(L_, nargs, nresults, base);
  lua_remove(L_, base);
  if (rc != LUA_OK) {
    if (rc == LUA_ERRMEM) {
      *error = "the script used more than " + std::to_string(limits_.memory_bytes >> 20) +
               " MiB of memory";
    } else {
      *error = lua_tostring(L_, -1) ? lua_tostring(L_, -1) : "error in the script";
    }
    lua_pop(L_, 1);
    return false;
  }
  return true;
}

}  // namespace zerod::scripting
