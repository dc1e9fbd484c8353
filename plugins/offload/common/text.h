// Message helpers shared by the tier plugins (header-only: each plugin is
// its own .so and links nothing of the other's).
#ifndef ZEROD_PLUGINS_OFFLOAD_COMMON_TEXT_H
#define ZEROD_PLUGINS_OFFLOAD_COMMON_TEXT_H

#include <zerod/kit/text.h>
#include <zerod/zerod_plugin.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace zerod::offload {

// The kit's (zerod/kit/text.h): an ABI err buffer, a NULL one allowed.
using zerod::set_error;

inline void copy_error(char* err, size_t err_size, const std::string& message) {
  set_error(err, err_size, "%s", message.c_str());
}

inline std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// "8 MiB", "1.5 GiB", "4096 bytes": sizes in messages, exact when whole
// (the kit's format_bytes in its shortest style).
inline std::string format_bytes(uint64_t bytes) { return zerod::format_bytes(bytes, BytesStyle::shortest); }

// Logs through the host's table when it has a log function (a test may pass
// no host at all).
inline void log_message(const zd_host_services* host, zd_log_level level, const char* plugin,
                        const std::string& message) {
  const size_t need = offsetof(zd_host_services, log) + sizeof(host->log);
  if (host == nullptr || host->struct_size < need || host->log == nullptr) return;
  host->log(host->host, level, plugin, message.c_str());
}

}  // namespace zerod::offload

#endif  // ZEROD_PLUGINS_OFFLOAD_COMMON_TEXT_H
