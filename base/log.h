// zerod's log, which the engine, the daemon and the launcher all write: one
// line per message on stderr, "zerod[<level>] ...".
// ZEROD_LOG=error|warn|info|debug sets the threshold (default warn).
#pragma once

#include <zerod/zerod_plugin.h>

#include <string>

namespace zerod {

bool log_enabled(zd_log_level level);
void log_message(zd_log_level level, const std::string& message);

inline void log_warn(const std::string& m) { log_message(ZD_LOG_WARN, m); }
inline void log_info(const std::string& m) { log_message(ZD_LOG_INFO, m); }
inline void log_debug(const std::string& m) { log_message(ZD_LOG_DEBUG, m); }

}  // namespace zerod
