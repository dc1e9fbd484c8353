#include "error.h"

#include <cstring>
#include <exception>

namespace zerod {

void fail(zd_status code, const std::string& message) { throw Error(code, message); }

Error error_being_handled(zd_status other) {
  try {
    throw;
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(other, e.what());
  } catch (...) {
    return Error(ZD_ERR_INTERNAL, "an unknown exception");
  }
}

const char* status_name(zd_status code) {
  switch (code) {
    case ZD_OK: return "ZD_OK";
    case ZD_ERR_INVALID_ARGUMENT: return "ZD_ERR_INVALID_ARGUMENT";
    case ZD_ERR_INVALID_STATE: return "ZD_ERR_INVALID_STATE";
    case ZD_ERR_NOT_FOUND: return "ZD_ERR_NOT_FOUND";
    case ZD_ERR_SHAPE_MISMATCH: return "ZD_ERR_SHAPE_MISMATCH";
    case ZD_ERR_CONFIG: return "ZD_ERR_CONFIG";
    case ZD_ERR_PLUGIN: return "ZD_ERR_PLUGIN";
    case ZD_ERR_OUT_OF_MEMORY: return "ZD_ERR_OUT_OF_MEMORY";
    case ZD_ERR_BUDGET: return "ZD_ERR_BUDGET";
    case ZD_ERR_IO: return "ZD_ERR_IO";
    case ZD_ERR_NOT_IMPLEMENTED: return "ZD_ERR_NOT_IMPLEMENTED";
    case ZD_ERR_VERSION: return "ZD_ERR_VERSION";
    case ZD_ERR_PEER_LOST: return "ZD_ERR_PEER_LOST";
    case ZD_ERR_TIMEOUT: return "ZD_ERR_TIMEOUT";
    case ZD_ERR_BUFFER_TOO_SMALL: return "ZD_ERR_BUFFER_TOO_SMALL";
    case ZD_ERR_INTERNAL: return "ZD_ERR_INTERNAL";
    default: return "ZD_ERR_UNKNOWN";
  }
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* text = strerror_r(err, buf, sizeof buf);
  return text;
}

}  // namespace zerod
