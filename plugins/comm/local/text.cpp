#include "text.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace zerod::comm {

Text::Text(char* buf, size_t size) : buf_(buf), cap_(size) { buf_[0] = '\0'; }

void Text::add(const char* fmt, ...) {
  if (len_ + 1 >= cap_) return;
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf_ + len_, cap_ - len_, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (static_cast<size_t>(n) < cap_ - len_) {
    len_ += static_cast<size_t>(n);
    return;
  }
  // Cut: say so, so that a reader does not take the tail for the end.
  len_ = cap_ - 1;
  std::memcpy(buf_ + cap_ - 4, "...", 4);
}

void Text::quoted(const char* s, size_t max_chars) {
  if (s == nullptr) {
    add("(none)");
    return;
  }
  const size_t n = strnlen(s, max_chars + 1);
  if (n > max_chars) add("\"%.*s...\"", static_cast<int>(max_chars), s);
  else add("\"%s\"", s);
}

void copy_text(char* dst, size_t size, const char* s) {
  if (size == 0) return;
  if (s == nullptr) s = "";
  const size_t n = strnlen(s, size - 1);
  std::memcpy(dst, s, n);
  dst[n] = '\0';
}

}  // namespace zerod::comm
