// What the subcommands that run a module of the zerod Python package
// (`zerod plot`: zerod.plot, `zerod ckpt import`: zerod.ckpt) give that
// Python: `import zerod` there must load the libzerod of this zerod's own
// install or build tree. Left to itself it looks elsewhere first, and after
// `cmake --install` without ldconfig the dynamic linker finds none.
#pragma once

#include <string>

namespace zerod::cli {

// The libzerod in `lib_dir`: libzerod.so.1 (the ABI major's soname), else
// the libzerod.so development link; "" when neither is there.
std::string libzerod_in(const std::string& lib_dir);

// The libzerod beside this zerod: in <its folder>/ZEROD_BINDIR_TO_LIBDIR,
// which follows CMAKE_INSTALL_LIBDIR (lib, lib64, lib/<multiarch>;
// cmake/InstallLayout.cmake). "" when there is none.
std::string libzerod_beside_this_zerod();

// Sets ZEROD_LIB to libzerod_beside_this_zerod() for the Python started
// next, unless the user chose one with ZEROD_LIB already.
void point_zerod_lib_at_this_install();

}  // namespace zerod::cli
