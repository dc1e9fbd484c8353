// Text helpers every comm plugin's ABI glue needs: an error into the host's
// buffer (the kit's set_error), and an info line through the host's log
// service.
#ifndef ZEROD_COMM_COMMON_PLUGIN_TEXT_H
#define ZEROD_COMM_COMMON_PLUGIN_TEXT_H

#include <zerod/kit/text.h>
#include <zerod/zerod_plugin.h>

#include <cstdarg>
#include <cstddef>
#include <cstdio>

namespace zerod::comm {

using zerod::set_error;

// An info line as `plugin`, when the host is new enough to have a log.
inline void log_info(const zd_host_services* host, const char* plugin, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline void log_info(const zd_host_services* host, const char* plugin, const char* fmt, ...) {
  const size_t need = offsetof(zd_host_services, log) + sizeof(host->log);
  if (host == nullptr || host->struct_size < need || host->log == nullptr) return;
  char message[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  host->log(host->host, ZD_LOG_INFO, plugin, message);
}

}  // namespace zerod::comm

#endif  // ZEROD_COMM_COMMON_PLUGIN_TEXT_H
