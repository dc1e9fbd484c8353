#include "sandbox.h"

#include "zerod_lib.h"

#include "error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

Sandbox* sandbox_of(lua_State* L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &kSandboxKey);
  auto* self = static_cast<Sandbox*>(lua_touserdata(L, -1));
  lua_pop(L, 1);
  return self;
}

// Lua's library functions run their loops inside C, where the instruction
// budget's hook never fires: s:find(".-.-.-b") over 5000 bytes backtracks
// for hours, string.rep("", math.maxinteger) copies nothing for centuries,
// and table.move({}, 1, 1 << 62, 1, {}) moves nils as long. The ones whose
// work can grow past their arguments' size are wrapped here: a call's work
// is estimated before it runs, in steps of about a nanosecond, and charged
// against the library budget of the call into the script
// (SandboxLimits::library_steps). One that would pass it is refused, named
// and said to be stopped; a loop of calls each under it is stopped as well.
// Job scripts match names and move small tables, far below it.

// A table element moved (a lua_geti and a lua_seti): about 16 steps.
constexpr double kStepsPerElement = 16;
// string.rep copies 16 bytes or more in a step.
constexpr double kBytesPerStep = 16;

// Charges the named call `steps` of work inside C, or stops it: raises the
// error naming it, `what` it would have done, and `hint`.
void charge(lua_State* L, const char* call, double steps, const char* what, const char* hint = "") {
  Sandbox* sb = sandbox_of(L);
  if (sb->spend_library_steps(steps)) return;
  char msg[640];  // no std::string: luaL_error's longjmp would skip its destructor
  std::snprintf(msg, sizeof msg,
                "%s: %s: stopped: the call could take about %.3g steps inside C, where the instruction budget "
                "cannot stop it; one call into the script may spend %.3g such steps in library calls (%.3g left)%s",
                call, what, steps, static_cast<double>(sb->limits().library_steps), sb->library_steps_left(), hint);
  luaL_error(L, "%s", msg);
}

// What multiplies the matcher's work by up to the subject's length: *, +,
// - and ? outside sets and escapes, %b (scans to the closing delimiter) and
// a back-reference %1-%9 (compares as many bytes as its capture holds).
int repetitions(const char* p, size_t len) {
  int k = 0;
  for (size_t i = 0; i < len; ++i) {
    if (p[i] == '%') {
      ++i;  // an escaped character or a class: not a repetition by itself
      if (i < len && p[i] == 'b') {
        ++k;
        i += 2;  // its two delimiters are characters, not operators
      } else if (i < len && p[i] >= '1' && p[i] <= '9') {
        ++k;
      }
    } else if (p[i] == '[') {
      // A set: '-' there is a range. Its first ']' (or '^]') is a member.
      ++i;
      if (i < len && p[i] == '^') ++i;
      if (i < len && p[i] == ']') ++i;
      for (; i < len && p[i] != ']'; ++i)
        if (p[i] == '%') ++i;
    } else if (p[i] == '*' || p[i] == '+' || p[i] == '-' || p[i] == '?') {
      ++k;
    }
  }
  return k;
}

// At most: each start position (one for an anchored pattern) compares up
// to min(m, n) bytes of an m-byte pattern (a plain find's memcmp as much as
// the matcher), and each repetition multiplies its attempts by the n + 1
// lengths it may take.
double search_steps(size_t n, size_t m, int k, bool anchored) {
  const double lengths = static_cast<double>(n) + 1;
  const double starts = anchored ? 1 : lengths;
  return starts * std::max(std::pow(lengths, k), static_cast<double>(std::min(n, m)));
}

// Calls the wrapped function (upvalue 1) with this call's arguments. The
// wrapper checked them first, so a bad one is named for the call the
// script made ("bad argument #1 to 'rep'"), not for an unnamed C function.
int call_wrapped(lua_State* L) {
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

// The bytes a search starting at argument 3 (`init`, as lstrlib.c reads
// it: negative from the end, clamped to the string) may look at. gsub
// has no `init`: the whole string.
size_t searched_bytes(lua_State* L, const char* name, size_t n) {
  if (std::strcmp(name, "gsub") == 0) return n;
  const lua_Integer init = luaL_optinteger(L, 3, 1);
  const auto len = static_cast<lua_Integer>(n);
  lua_Integer first = init > 0 ? init : init == 0 || init < -len ? 1 : len + init + 1;
  if (first > len + 1) return 0;  // past the end: nothing is searched
  return static_cast<size_t>(len - first + 1);
}

// string.find/match/gmatch/gsub; upvalue 2 is the name. find with `plain`
// searches without a pattern, but compares as much. gmatch is charged
// once: its iterations together try each start position once.
int bounded_pattern_call(lua_State* L) {
  size_t n = 0, m = 0;
  luaL_checklstring(L, 1, &n);
  const char* pattern = luaL_checklstring(L, 2, &m);
  const char* name = lua_tostring(L, lua_upvalueindex(2));
  const bool find = std::strcmp(name, "find") == 0;
  const bool plain = find && lua_toboolean(L, 4);
  const int k = plain ? 0 : repetitions(pattern, m);
  // gmatch takes a leading '^' as a character (it would stop the iteration).
  const bool anchored = !plain && m > 0 && pattern[0] == '^' && std::strcmp(name, "gmatch") != 0;
  const size_t searched = searched_bytes(L, name, n);
  char call[32], what[160];
  std::snprintf(call, sizeof call, "string.%s", name);
  if (k > 0)
    std::snprintf(what, sizeof what, "a pattern with %d repetition%s over a %zu-byte string", k, k == 1 ? "" : "s", n);
  else
    std::snprintf(what, sizeof what, "looking for a %zu-byte %s in a %zu-byte string", m,
                  plain ? "string" : "pattern", n);
  const double worst = search_steps(searched, m, k, anchored);
  const char* hint = k > 0 ? "; use fewer repetitions (*, +, -, ?, %b, %1-%9) or a shorter string" : "";
  if (!find || k > 0 || worst > sandbox_of(L)->library_steps_left()) {
    charge(L, call, worst, what, hint);  // refused here when the worst case does not fit
    return call_wrapped(L);
  }
  // A find without repetitions stops at its match: a loop splitting a long
  // string from `init` on (text:find("\n", pos, true)) does about the
  // string's length in all, so it is charged what it scanned, not the rest
  // of the string at every call. The worst case fitting is checked above.
  const lua_Integer init = static_cast<lua_Integer>(n - searched) + 1;
  const int results = call_wrapped(L);
  const bool found = results > 0 && lua_isinteger(L, -results);
  const double starts = found ? static_cast<double>(lua_tointeger(L, -results) - init + 1)
                              : static_cast<double>(searched) + 1;
  charge(L, call, starts * static_cast<double>(std::max<size_t>(1, std::min(m, searched))), what, hint);
  return results;
}

// string.rep(s, n [, sep]): its loop runs n times even for an empty
// result. A result past the state's memory cap (upvalue 2) fails anyway;
// it is refused here by name rather than as "not enough memory".
int bounded_rep(lua_State* L) {
  size_t len = 0, sep = 0;
  luaL_checklstring(L, 1, &len);
  const lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &sep);
  if (n <= 0) return call_wrapped(L);
  const double bytes = static_cast<double>(n) * static_cast<double>(len + sep);
  const auto cap = static_cast<double>(lua_tointeger(L, lua_upvalueindex(2)));
  if (bytes > cap)
    return luaL_error(L, "string.rep: %I copies of %I bytes: stopped: the result would be more than the script's %I "
                         "MiB of memory", n,
                      static_cast<lua_Integer>(len + sep), static_cast<lua_Integer>(cap) >> 20);
  char what[96];
  std::snprintf(what, sizeof what, "%lld copies", static_cast<long long>(n));
  charge(L, "string.rep", static_cast<double>(n) + bytes / kBytesPerStep, what);
  return call_wrapped(L);
}

// table.move(a1, f, e, t [, a2]) moves e - f + 1 elements in a C loop.
int bounded_move(lua_State* L) {
  const lua_Integer f = luaL_checkinteger(L, 2);
  const lua_Integer e = luaL_checkinteger(L, 3);
  luaL_checkinteger(L, 4);
  if (e >= f) {
    // Exact in unsigned arithmetic, whatever the signs.
    const double elements = static_cast<double>(static_cast<lua_Unsigned>(e) - static_cast<lua_Unsigned>(f)) + 1;
    char what[96];
    std::snprintf(what, sizeof what, "moving %.0f elements", elements);
    charge(L, "table.move", elements * kStepsPerElement, what);
  }
  return call_wrapped(L);
}

// table.insert(t, pos, v) and table.remove(t, pos) shift the elements
// between pos and #t in a C loop, and #t is whatever t's __len says: 1 << 62
// made them run for centuries. They are Lua 5.4's own (ltablib.c) with the
// shift charged; a wrapper could not charge them, as the wrapped function
// asks __len again and may hear another answer.
void charge_shift(lua_State* L, const char* call, lua_Integer from, lua_Integer to) {
  if (to <= from) return;
  const double elements = static_cast<double>(static_cast<lua_Unsigned>(to) - static_cast<lua_Unsigned>(from));
  char what[96];
  std::snprintf(what, sizeof what, "shifting %.0f elements", elements);
  charge(L, call, elements * kStepsPerElement, what);
}

// (ltablib.c also takes a non-table with the metamethods it needs; in a
// job script only tables have them.)
int bounded_insert(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const lua_Integer e = luaL_intop(+, luaL_len(L, 1), 1);  // the first empty element
  lua_Integer pos = e;
  switch (lua_gettop(L)) {
    case 2: break;  // append
    case 3: {
      pos = luaL_checkinteger(L, 2);
      luaL_argcheck(L, static_cast<lua_Unsigned>(pos) - 1u < static_cast<lua_Unsigned>(e), 2,
                    "position out of bounds");
      charge_shift(L, "table.insert", pos, e);
      for (lua_Integer i = e; i > pos; --i) {  // t[i] = t[i - 1]
        lua_geti(L, 1, i - 1);
        lua_seti(L, 1, i);
      }
      break;
    }
    default: return luaL_error(L, "wrong number of arguments to 'insert'");
  }
  lua_seti(L, 1, pos);
  return 0;
}

int bounded_remove(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const lua_Integer size = luaL_len(L, 1);
  lua_Integer pos = luaL_optinteger(L, 2, size);
  if (pos != size)
    luaL_argcheck(L, static_cast<lua_Unsigned>(pos) - 1u <= static_cast<lua_Unsigned>(size), 2,
                  "position out of bounds");
  charge_shift(L, "table.remove", pos, size);
  lua_geti(L, 1, pos);  // the result
  for (; pos < size; ++pos) {  // t[pos] = t[pos + 1]
    lua_geti(L, 1, pos + 1);
    lua_seti(L, 1, pos);
  }
  lua_pushnil(L);
  lua_seti(L, 1, pos);
  return 1;
}

// Replaces lib.name with fn, which gets the original and `extra` as
// upvalues 1 and 2.
void wrap(lua_State* L, const char* lib, const char* name, lua_CFunction fn, lua_Integer extra) {
  lua_getglobal(L, lib);
  lua_getfield(L, -1, name);
  lua_pushinteger(L, extra);
  lua_pushcclosure(L, fn, 2);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
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
  Sandbox* self = sandbox_of(L);
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

bool Sandbox::spend_library_steps(double steps) {
  if (!(steps <= library_steps_left_)) return false;  // NaN too
  library_steps_left_ -= steps;
  return true;
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
  const auto cap = static_cast<lua_Integer>(limits_.memory_bytes);
  wrap(L_, LUA_STRLIBNAME, "rep", bounded_rep, cap);
  wrap(L_, LUA_TABLIBNAME, "move", bounded_move, 0);
  // Replaced, not wrapped (charge_shift says why).
  lua_getglobal(L_, LUA_TABLIBNAME);
  lua_pushcfunction(L_, bounded_insert);
  lua_setfield(L_, -2, "insert");
  lua_pushcfunction(L_, bounded_remove);
  lua_setfield(L_, -2, "remove");
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
  library_steps_left_ = static_cast<double>(limits_.library_steps);
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
