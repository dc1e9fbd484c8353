#include "zerod_lib.h"

#include "ds_config.h"
#include "error.h"
#include "size.h"

#include <hwloc.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace zerod::scripting {

// The library's Lua half, embedded at build time from zerod_lib.lua.
extern const char* const kZerodLibSource;

namespace {

// A number given to zerod.size as a byte count: an integer >= 0. A float
// must be a whole number an integer holds (a cast of inf, nan or 2^63 is
// undefined; 1.9 was cut to 1 without a word).
int size_of_number(lua_State* L) {
  lua_Integer bytes = 0;
  if (lua_isinteger(L, 1)) {
    bytes = lua_tointeger(L, 1);
  } else {
    const lua_Number v = lua_tonumber(L, 1);
    // Whole (nan is not), and in [-2^63, 2^63) (inf is not), which lua_numbertointeger checks.
    if (!(v == std::floor(v)) || !lua_numbertointeger(v, &bytes))
      return luaL_error(L, "zerod.size: a size is a whole number of bytes below 2^63, got %f", v);
  }
  if (bytes < 0) return luaL_error(L, "zerod.size: a size cannot be negative (%I)", bytes);
  lua_pushinteger(L, bytes);
  return 1;
}

// zerod.size("512MiB") -> 536870912; numbers pass through.
int l_size(lua_State* L) {
  if (lua_type(L, 1) == LUA_TNUMBER) return size_of_number(L);
  const char* text = luaL_checkstring(L, 1);
  const SizeReading size = read_size(text);
  if (!size.bytes) return luaL_error(L, "zerod.size: bad size '%s': %s", text, size.why_not);
  lua_pushinteger(L, static_cast<lua_Integer>(*size.bytes));
  return 1;
}

// zerod.topology() -> { pus = n, cores = n, numa_nodes = { { index = i,
// cpus = { ... }, memory = bytes }, ... } } — the machine as hwloc sees it
// (HWLOC_XMLFILE substitutes a recorded one).
int l_topology(lua_State* L) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0)
    return luaL_error(L, "zerod.topology: hwloc cannot read this machine's topology");
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
  lua_setfield(L, -2, "pus");
  lua_pushinteger(L, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
  lua_setfield(L, -2, "cores");
  const int nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  lua_createtable(L, nodes, 0);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, static_cast<lua_Integer>(n->os_index));
    lua_setfield(L, -2, "index");
    lua_pushinteger(L, static_cast<lua_Integer>(n->attr ? n->attr->numanode.local_memory : 0));
    lua_setfield(L, -2, "memory");
    lua_newtable(L);
    int k = 0;
    for (int cpu = hwloc_bitmap_first(n->cpuset); cpu != -1; cpu = hwloc_bitmap_next(n->cpuset, cpu)) {
      lua_pushinteger(L, cpu);
      lua_rawseti(L, -2, ++k);
    }
    lua_setfield(L, -2, "cpus");
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "numa_nodes");
  hwloc_topology_destroy(topo);
  return 1;
}

// zerod.free_memory() -> bytes the kernel says are available (MemAvailable).
int l_free_memory(lua_State* L) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  unsigned long long kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") {
      lua_pushinteger(L, static_cast<lua_Integer>(kb * 1024));
      return 1;
    }
  return luaL_error(L, "zerod.free_memory: /proc/meminfo has no MemAvailable");
}

// zerod.free_disk(path) -> bytes free for us on path's file system.
int l_free_disk(lua_State* L) {
  const char* path = luaL_checkstring(L, 1);
  struct statvfs st {};
  if (statvfs(path, &st) != 0)
    return luaL_error(L, "zerod.free_disk: %s: %s", path, errno_text(errno).c_str());
  lua_pushinteger(L, static_cast<lua_Integer>(st.f_bavail * st.f_frsize));
  return 1;
}

// Translates a DeepSpeed config and pushes the job script's text, or the
// message that says what is wrong with it (then returns false). The C++
// strings are gone before the caller raises a Lua error.
bool push_translation(lua_State* L, const char* text, size_t n) {
  std::string out;
  bool ok = true;
  try {
    out = translate_deepspeed(std::string(text, n), "the DeepSpeed config").lua;
  } catch (const std::exception& e) {
    out = e.what();
    ok = false;
  }
  lua_pushlstring(L, out.data(), out.size());
  return ok;
}

// zerod.deepspeed(json_text) -> the settings table a DeepSpeed config
// translates to (ds_config.h), for a script to adjust and return.
int l_deepspeed(lua_State* L) {
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  if (!push_translation(L, text, n)) {
    luaL_where(L, 1);
    lua_insert(L, -2);
    lua_concat(L, 2);
    return lua_error(L);
  }
  size_t len = 0;
  const char* lua = lua_tolstring(L, -1, &len);
  if (luaL_loadbufferx(L, lua, len, "=DeepSpeed config (translated)", "t") != LUA_OK) return lua_error(L);
  lua_call(L, 0, 1);
  return 1;
}

}  // namespace

void open_zerod_library(lua_State* L) {
  lua_newtable(L);
  lua_pushcfunction(L, l_size);
  lua_setfield(L, -2, "size");
  lua_pushcfunction(L, l_topology);
  lua_setfield(L, -2, "topology");
  lua_pushcfunction(L, l_free_memory);
  lua_setfield(L, -2, "free_memory");
  lua_pushcfunction(L, l_free_disk);
  lua_setfield(L, -2, "free_disk");
  lua_pushcfunction(L, l_deepspeed);
  lua_setfield(L, -2, "deepspeed");
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
