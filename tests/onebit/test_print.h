// Readable ISA names in gtest output for the 1-bit tests.
#ifndef ZEROD_TESTS_ONEBIT_TEST_PRINT_H
#define ZEROD_TESTS_ONEBIT_TEST_PRINT_H

#include <ostream>

#include "onebit_kernels.h"

namespace zerod::comm::onebit::detail {
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace zerod::comm::onebit::detail

#endif  // ZEROD_TESTS_ONEBIT_TEST_PRINT_H
