// Lua API calls that can raise, made where a raise cannot abort the process.
//
// Reading a job script's settings runs the script's own code — an __index
// metamethod on a settings table, the global `zerod` table's — and allocates
// in its capped state; any of these raises a Lua error (the metamethod's,
// the instruction budget's, "not enough memory" at the cap). Lua raises with
// longjmp, and with no protected call to land in it calls abort(): the
// daemon, and every job in it, would go down with one client's script. So
// those calls go through protected_call, which runs them under lua_pcall.
//
// Why not raw access (lua_rawget) and a refusal of settings tables that
// carry a metatable? Allocation still raises (the key's string, the
// registry's ref table, a hook's argument table), so a protected call is
// needed anyway; and a table whose defaults come from an __index table is
// ordinary Lua that a script may use.
#pragma once

#include <lua.hpp>

#include <string>
#include <type_traits>

namespace zerod::scripting {

namespace detail {
struct ProtectedBody {
  int (*run)(lua_State* L, void* body);
  void* body;
};
int protected_call(lua_State* L, int arg, int nresults, const ProtectedBody& body, std::string* error);
}  // namespace detail

// Runs body(L) under lua_pcall: body gets a copy of the value at stack
// index arg at its index 1 (arg 0: no argument), and returns how many values
// it pushed; the first nresults of them are left on the stack. On a Lua
// error returns its status (LUA_ERRMEM when the state is at its memory cap)
// with the message in *error, and leaves the stack as it was. The
// instruction budget and the memory cap still apply inside.
//
// body runs between Lua's setjmp and longjmp: it must keep no object with a
// destructor alive across a Lua API call (a longjmp skips destructors). A
// C++ exception it throws is caught inside and becomes a Lua error.
template <class Body>
int protected_call(lua_State* L, int arg, int nresults, Body&& body, std::string* error) {
  using B = std::remove_reference_t<Body>;
  const detail::ProtectedBody b{[](lua_State* s, void* p) { return (*static_cast<B*>(p))(s); },
                                const_cast<void*>(static_cast<const void*>(&body))};
  return detail::protected_call(L, arg, nresults, b, error);
}

}  // namespace zerod::scripting
