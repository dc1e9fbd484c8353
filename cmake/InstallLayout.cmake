# The relative paths between the install's bin and lib folders, for the code
# that finds one from the other at run time: libzerod starts the zerod beside
# it (libzerod/src/node_daemon.cpp), zerod points Python at the libzerod
# beside it (daemon/cli/zerod_python.cpp). CMAKE_INSTALL_LIBDIR is lib, lib64
# or lib/x86_64-linux-gnu depending on the distribution and the prefix, so
# "../lib" and "../bin" are right for the first only. The build tree mirrors
# the install tree (CMakeLists.txt), so the same paths hold there.
function(zerod_relative_install_dirs bindir libdir bin_to_lib_var lib_to_bin_var)
  file(RELATIVE_PATH bin_to_lib "${bindir}" "${libdir}")
  file(RELATIVE_PATH lib_to_bin "${libdir}" "${bindir}")
  # One folder for both gives "": the code appends "/zerod" to the result.
  if(bin_to_lib STREQUAL "")
    set(bin_to_lib ".")
    set(lib_to_bin ".")
  endif()
  set(${bin_to_lib_var} "${bin_to_lib}" PARENT_SCOPE)
  set(${lib_to_bin_var} "${lib_to_bin}" PARENT_SCOPE)
endfunction()
