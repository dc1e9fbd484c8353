# cmake -P: the paths between the bin and lib folders that libzerod and zerod
# find each other by (cmake/InstallLayout.cmake), for each CMAKE_INSTALL_LIBDIR
# a distribution uses. "../lib" and "../bin", assumed before, are wrong for
# all but the first: an install to lib64 then started an older zerod from PATH.
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/InstallLayout.cmake")

function(expect bindir libdir want_bin_to_lib want_lib_to_bin)
  zerod_relative_install_dirs("${bindir}" "${libdir}" bin_to_lib lib_to_bin)
  if(NOT bin_to_lib STREQUAL want_bin_to_lib OR NOT lib_to_bin STREQUAL want_lib_to_bin)
    message(FATAL_ERROR "bin ${bindir}, lib ${libdir}: got bin->lib '${bin_to_lib}', lib->bin '${lib_to_bin}'; "
                        "want '${want_bin_to_lib}', '${want_lib_to_bin}'")
  endif()
endfunction()

expect(/usr/local/bin /usr/local/lib ../lib ../bin)
expect(/usr/local/bin /usr/local/lib64 ../lib64 ../bin)
expect(/usr/bin /usr/lib/x86_64-linux-gnu ../lib/x86_64-linux-gnu ../../bin)
expect(/opt/zerod/bin /opt/zerod/bin . .)
message("relative install dirs: lib, lib64, lib/<multiarch> and one folder for both")
