// The launcher's pipes, pidfds and /dev/null are held in the transport's
// owned file descriptor (header-only), under the launcher's name for it.
#pragma once

#include "transport/unique_fd.h"

namespace zerod::launch::detail {

using transport::UniqueFd;

}  // namespace zerod::launch::detail
