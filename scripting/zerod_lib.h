// The `zerod` Lua library: pushes its table onto the stack.
#pragma once

#include <lua.hpp>

namespace zerod::scripting {

void open_zerod_library(lua_State* L);

}  // namespace zerod::scripting
