#include "launcher/detail/line_buffer.h"

#include <utility>

namespace zerod::launch::detail {

LineBuffer::LineBuffer(std::string prefix, size_t max_line)
    : prefix_(std::move(prefix)), max_line_(max_line == 0 ? 1 : max_line) {}

void LineBuffer::emit(std::string_view tail, std::string& out) {
  out.append(prefix_);
  out.append(partial_);
  out.append(tail);
  out.push_back('\n');
  partial_.clear();
}

void LineBuffer::feed(std::string_view data, std::string& out) {
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t room = max_line_ - partial_.size();
    const size_t nl = data.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? data.size() : nl;
    const size_t len = end - pos;
    if (len > room) {
      // Too long for one line: cut it at max_line_ and go on with the rest.
      emit(data.substr(pos, room), out);
      pos += room;
    } else if (nl != std::string_view::npos) {
      emit(data.substr(pos, len), out);
      pos = nl + 1;
    } else {
      partial_.append(data.substr(pos));
      pos = data.size();
    }
  }
}

void LineBuffer::finish(std::string& out) {
  if (!partial_.empty()) emit({}, out);
}

}  // namespace zerod::launch::detail
