#include "launcher/own_environment.h"

#include <cstdlib>
#include <mutex>
#include <set>

namespace zerod::launch {

namespace {

std::mutex mu;
std::set<std::string>& own() {
  static std::set<std::string> names;
  return names;
}

}  // namespace

bool set_for_this_process_only(const std::string& name, const std::string& value) {
  if (std::getenv(name.c_str()) != nullptr) return false;  // the user's, kept
  if (::setenv(name.c_str(), value.c_str(), 0) != 0) return false;
  std::lock_guard<std::mutex> lock(mu);
  own().insert(name);
  return true;
}

void drop_own_variables(std::map<std::string, std::string>& env) {
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& name : own()) env.erase(name);
}

}  // namespace zerod::launch
