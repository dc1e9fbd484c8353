#include "lua_protect.h"

#include <cstdio>
#include <exception>

namespace zerod::scripting::detail {

namespace {

// The C function lua_pcall calls: the body's address at 1, its argument after.
int trampoline(lua_State* L) {
  const auto* b = static_cast<const ProtectedBody*>(lua_touserdata(L, 1));
  lua_remove(L, 1);
  // A C++ exception must not unwind through Lua's C frames: it is caught
  // here, its text copied out, and raised as a Lua error once the exception
  // object is gone (luaL_error does not return; nothing here has a
  // destructor).
  char what[512];
  try {
    return b->run(L, b->body);
  } catch (const std::exception& e) {
    std::snprintf(what, sizeof what, "%s", e.what());
  } catch (...) {
    std::snprintf(what, sizeof what, "an unknown C++ exception");
  }
  return luaL_error(L, "%s", what);
}

}  // namespace

int protected_call(lua_State* L, int arg, int nresults, const ProtectedBody& body, std::string* error) {
  if (arg != 0) arg = lua_absindex(L, arg);
  // lua_checkstack reports a failure to grow instead of raising.
  if (!lua_checkstack(L, 3 + (nresults > 0 ? nresults : 0))) {
    *error = "the Lua stack cannot grow (out of memory)";
    return LUA_ERRMEM;
  }
  // A light C function and a light userdata: pushing them allocates nothing.
  lua_pushcfunction(L, trampoline);
  lua_pushlightuserdata(L, const_cast<ProtectedBody*>(&body));
  if (arg != 0) lua_pushvalue(L, arg);
  const int rc = lua_pcall(L, arg != 0 ? 2 : 1, nresults, 0);
  if (rc == LUA_OK) return rc;
  if (rc == LUA_ERRMEM)
    *error = "out of memory: the job script's Lua state is at its memory cap";
  else if (lua_type(L, -1) == LUA_TSTRING)  // no conversion: that would allocate, unprotected
    *error = lua_tostring(L, -1);
  else
    *error = std::string("an error whose value is a ") + luaL_typename(L, -1);
  lua_pop(L, 1);
  return rc;
}

}  // namespace zerod::scripting::detail
