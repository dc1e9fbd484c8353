// The reduction kernels for any CPU of the target architecture.
#define ZEROD_COMM_ISA base
#include "kernels_impl.h"
