// Errors inside zerod are C++ exceptions carrying a zd_status and a message
// that names the culprit. They never cross the C ABI: libzerod/src catches them
// and turns them into a status plus zd_last_error().
#pragma once

#include <zerod/zerod.h>

#include <stdexcept>
#include <string>

namespace zerod {

class Error : public std::runtime_error {
 public:
  Error(zd_status code, const std::string& message) : std::runtime_error(message), code_(code) {}
  zd_status code() const noexcept { return code_; }

 private:
  zd_status code_;
};

[[noreturn]] void fail(zd_status code, const std::string& message);

// Inside a catch block: the exception being handled, as an Error (one that
// is not an Error gets `other` as its code), for a failure path that must
// act on it (break the job with its reason) before rethrowing.
Error error_being_handled(zd_status other = ZD_ERR_INTERNAL);

// "ZD_ERR_CONFIG" etc.; "ZD_ERR_UNKNOWN" for a value this build does not know.
const char* status_name(zd_status code);

// strerror(err) as a string, thread-safe.
std::string errno_text(int err);

}  // namespace zerod

// Checks a system call that returns -1 and sets errno; on failure throws with
// what was being done, the errno text and where.
#define ZD_CHECK_SYS(expr, what)                                                              \
  do {                                                                                        \
    if ((expr) == -1) {                                                                       \
      int zd_saved_errno_ = errno;                                                            \
      ::zerod::fail(zd_saved_errno_ == ENOMEM ? ZD_ERR_OUT_OF_MEMORY : ZD_ERR_IO,            \
                    std::string(what) + ": " + ::zerod::errno_text(zd_saved_errno_) + " (" + \
                        __FILE__ + ":" + std::to_string(__LINE__) + ")");                     \
    }                                                                                         \
  } while (0)
