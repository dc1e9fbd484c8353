#include "launcher/own_environment.h"

#include <cstdlib>
#include <mutex>
#include <optional>

namespace zerod::launch {

namespace {

std::mutex mu;
// name -> the user's value (none: unset).
std::map<std::string, std::optional<std::string>>& users() {
  static std::map<std::string, std::optional<std::string>> values;
  return values;
}

}  // namespace

std::string set_for_this_process_only(const std::string& name, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu);
  // The first call's reading is the user's: a second call finds ours.
  auto [it, fresh] = users().try_emplace(name);
  if (fresh) {
    const char* was = std::getenv(name.c_str());
    if (was) it->second = std::string(was);
  }
  ::setenv(name.c_str(), value.c_str(), 1);
  return it->second.value_or("");
}

void restore_user_values(std::map<std::string, std::string>& env) {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [name, was] : users()) {
    if (was)
      env.insert_or_assign(name, *was);
    else
      env.erase(name);
  }
}

}  // namespace zerod::launch
