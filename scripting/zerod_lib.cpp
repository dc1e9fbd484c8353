#include "zerod_lib.h"

#include "size.h"

#include <string>

namespace zerod::scripting {

// The library's Lua half, embedded at build time from zerod_lib.lua.
extern const char* const kZerodLibSource;

namespace {

// zerod.size("512MiB") -> 536870912; numbers pass through.
int l_size(lua_State* L) {
  if (lua_type(L, 1) == LUA_TNUMBER) {
    const lua_Number v = lua_tonumber(L, 1);
    if (v < 0) return luaL_error(L, "zerod.size: a size cannot be negative (%f)", v);
    lua_pushinteger(L, static_cast<lua_Integer>(v));
    return 1;
  }
  const char* text = luaL_checkstring(L, 1);
  const auto bytes = parse_size(text);
  if (!bytes)
    return luaL_error(L, "zerod.size: bad size '%s': expected a number and a unit such as "
                         "\"512MiB\", \"1.5GiB\" or \"4GB\"", text);
  lua_pushinteger(L, static_cast<lua_Integer>(*bytes));
  return 1;
}

}  // namespace

void open_zerod_library(lua_State* L) {
  lua_newtable(L);
  lua_pushcfunction(L, l_size);
  lua_setfield(L, -2, "size");
  const struct {
    const char* name;
    lua_Integer bytes;
  } units[] = {{"KiB", lua_Integer{1} << 10}, {"MiB", lua_Integer{1} << 20},
               {"GiB", lua_Integer{1} << 30}, {"TiB", lua_Integer{1} << 40}};
  for (const auto& u : units) {
    lua_pushinteger(L, u.bytes);
    lua_setfield(L, -2, u.name);
  }
  // Run the Lua half with the table as its argument; it returns the table.
  if (luaL_loadbufferx(L, kZerodLibSource, std::char_traits<char>::length(kZerodLibSource),
                       "=zerod", "t") != LUA_OK) {
    lua_error(L);
  }
  lua_insert(L, -2);
  lua_call(L, 1, 1);
}

}  // namespace zerod::scripting
