// Splits one output stream of a rank into lines and renders each as
// "<prefix><line>\n". Only whole lines come out, so output from different
// ranks interleaves at line boundaries only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace zerod::launch::detail {

class LineBuffer {
 public:
  // A line longer than this is cut: each max_line bytes go out as a line of
  // their own, so a rank writing megabytes without a newline neither grows
  // zerod's memory nor holds back the other ranks.
  static constexpr size_t kMaxLine = 64 * 1024;

  explicit LineBuffer(std::string prefix = {}, size_t max_line = kMaxLine);

  // Appends to `out` every line completed by `data`; keeps the unterminated
  // rest for the next call. Bytes pass unchanged (NUL, invalid UTF-8, '\r').
  void feed(std::string_view data, std::string& out);

  // At end of stream: appends the unterminated rest, if any, with a '\n'.
  void finish(std::string& out);

  size_t pending() const { return partial_.size(); }

 private:
  void emit(std::string_view tail, std::string& out);

  std::string prefix_;
  size_t max_line_;
  std::string partial_;  // never longer than max_line_
};

}  // namespace zerod::launch::detail
