// A message built into a fixed buffer: appends truncate rather than
// allocate, so failure paths (which run under the communicator's lock and
// must always finish) never throw.
#ifndef ZEROD_COMM_LOCAL_TEXT_H
#define ZEROD_COMM_LOCAL_TEXT_H

#include <cstddef>

namespace zerod::comm {

class Text {
 public:
  // buf must hold size >= 4 bytes; it is emptied.
  Text(char* buf, size_t size);

  void add(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  // Appends s as a quoted string, cut at max_chars ("(none)" for NULL).
  void quoted(const char* s, size_t max_chars);

  const char* str() const { return buf_; }
  size_t size() const { return len_; }

 private:
  char* buf_;
  size_t cap_;
  size_t len_ = 0;
};

// Copies s into dst (size bytes), cut and terminated; NULL becomes "".
void copy_text(char* dst, size_t size, const char* s);

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_TEXT_H
