# What `cmake --install` adds beyond each folder's own rules: the CMake
# package (find_package(zerod) -> zerod::zerod) and a pkg-config file.
include(CMakePackageConfigHelpers)

set(ZEROD_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/zerod")
install(EXPORT zerodTargets NAMESPACE zerod:: DESTINATION "${ZEROD_CMAKE_DIR}")
configure_package_config_file(cmake/zerodConfig.cmake.in
  "${PROJECT_BINARY_DIR}/zerodConfig.cmake"
  INSTALL_DESTINATION "${ZEROD_CMAKE_DIR}"
  PATH_VARS ZEROD_PLUGIN_SUBDIR)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/zerodConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/zerodConfig.cmake" "${PROJECT_BINARY_DIR}/zerodConfigVersion.cmake"
  DESTINATION "${ZEROD_CMAKE_DIR}")

# The .pc file finds its prefix from where it lies (pkg-config's
# ${pcfiledir}), so that `cmake --install --prefix DIR` gives a file that
# names DIR, not the prefix configured at build time.
file(RELATIVE_PATH ZEROD_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" ZEROD_PC_TO_PREFIX "${ZEROD_PC_TO_PREFIX}")
configure_file(cmake/zerod.pc.in "${PROJECT_BINARY_DIR}/zerod.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/zerod.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
