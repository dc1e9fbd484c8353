// The whole body of the *_without_engine executables (tests/transport,
// tests/launcher, tests/daemon). What they test is their link: every object
// of one static library, forced in whole, must resolve against the
// libraries that library declares (zerod_base, the system), so a reference
// to an engine symbol fails the build. Running one only confirms that it
// was built.
#include <cstdio>

int main(int argc, char** argv) {
  std::printf("%s: linked without the engine\n", argc > 0 ? argv[0] : "links_alone");
  return 0;
}
