// A comma-decimal locale (de_DE.UTF-8) set for the whole process, as an
// embedding trainer sets its own: setlocale (what Python's locale.setlocale
// does) and the C++ global locale (std::locale::global). Files that other
// processes read must come out the same under it.
//
// The locale is the system's where it is installed; else one is compiled
// with localedef (the `locales` package's sources) into a temporary LOCPATH.
// Where neither works, available() is false and why_not() says why (the
// test skips). The destructor puts back "C" and the classic C++ locale.
#pragma once

#include <unistd.h>

#include <clocale>
#include <cstdlib>
#include <filesystem>
#include <locale>
#include <optional>
#include <stdexcept>
#include <string>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace zerod_test {

// glibc keeps a path list of its own (argz) for a locale found through
// LOCPATH and never frees it: not the code under test's, so LeakSanitizer
// does not count what setlocale allocates here.
struct LocaleAllocations {
#if defined(__SANITIZE_ADDRESS__)
  LocaleAllocations() { __lsan_disable(); }
  ~LocaleAllocations() { __lsan_enable(); }
#endif
};

class CommaLocale {
 public:
  static constexpr const char* kName = "de_DE.UTF-8";

  CommaLocale() {
    if (!set_all()) compile_and_set();
    if (available_ && std::localeconv()->decimal_point[0] != ',') {
      why_not_ = std::string(kName) + " does not write a decimal comma here";
      restore();
    }
  }
  ~CommaLocale() {
    restore();
    if (locpath_set_) {
      if (locpath_before_)
        setenv("LOCPATH", locpath_before_->c_str(), 1);
      else
        unsetenv("LOCPATH");
    }
    if (!locpath_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(locpath_, ec);
    }
  }
  CommaLocale(const CommaLocale&) = delete;
  CommaLocale& operator=(const CommaLocale&) = delete;

  bool available() const { return available_; }
  const std::string& why_not() const { return why_not_; }

 private:
  // The C locale and the C++ global one, as a trainer would set them.
  bool set_all() {
    [[maybe_unused]] const LocaleAllocations glibc_own;
    if (!std::setlocale(LC_ALL, kName)) return false;
    try {
      std::locale::global(std::locale(kName));
    } catch (const std::runtime_error&) {
      std::setlocale(LC_ALL, "C");
      return false;
    }
    available_ = true;
    return true;
  }

  void compile_and_set() {
    char tmpl[] = "/tmp/zerod-locale-XXXXXX";
    if (!mkdtemp(tmpl)) {
      why_not_ = "no temporary folder for a compiled locale";
      return;
    }
    locpath_ = tmpl;
    const std::string cmd = "localedef -i de_DE -f UTF-8 " + locpath_ + "/" + kName + " >/dev/null 2>&1";
    // localedef exits 1 for warnings about the definition, with the locale
    // written all the same: whether setlocale takes it is what counts.
    if (std::system(cmd.c_str()) == -1 || !std::filesystem::exists(locpath_ + "/" + kName)) {
      why_not_ = std::string(kName) + " is not installed and localedef could not compile it (Debian: apt-get install locales)";
      return;
    }
    if (const char* before = std::getenv("LOCPATH")) locpath_before_ = before;
    setenv("LOCPATH", locpath_.c_str(), 1);
    locpath_set_ = true;
    if (!set_all()) why_not_ = std::string("setlocale refused the ") + kName + " localedef compiled";
  }

  void restore() {
    if (!available_) return;
    [[maybe_unused]] const LocaleAllocations glibc_own;
    std::locale::global(std::locale::classic());
    std::setlocale(LC_ALL, "C");
    available_ = false;
  }

  bool available_ = false;
  std::string why_not_;
  std::string locpath_;
  std::optional<std::string> locpath_before_;
  bool locpath_set_ = false;
};

}  // namespace zerod_test
