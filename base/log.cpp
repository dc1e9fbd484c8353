#include "log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace zerod {

namespace {

zd_log_level threshold() {
  static const zd_log_level level = [] {
    const char* env = std::getenv("ZEROD_LOG");
    if (!env) return ZD_LOG_WARN;
    if (!std::strcmp(env, "error")) return ZD_LOG_ERROR;
    if (!std::strcmp(env, "info")) return ZD_LOG_INFO;
    if (!std::strcmp(env, "debug")) return ZD_LOG_DEBUG;
    return ZD_LOG_WARN;
  }();
  return level;
}

const char* level_name(zd_log_level level) {
  switch (level) {
    case ZD_LOG_ERROR: return "error";
    case ZD_LOG_WARN: return "warn";
    case ZD_LOG_INFO: return "info";
    default: return "debug";
  }
}

}  // namespace

bool log_enabled(zd_log_level level) { return level <= threshold(); }

void log_message(zd_log_level level, const std::string& message) {
  if (!log_enabled(level)) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "zerod[%s] %s\n", level_name(level), message.c_str());
}

}  // namespace zerod
