#include "torch_state.h"

#include "error.h"
#include "manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

namespace zerod::ckpt {

namespace fs = std::filesystem;

namespace {

// A JSON value, as much of JSON as a safetensors header uses: objects,
// arrays, strings and numbers (kept as their text), true, false, null.
struct Json {
  enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  std::string text;  // a string's value; a number's or a literal's text
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* find(const std::string& key) const {
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
};

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

  Json parse_document() {
    Json v = value(0);
    skip_space();
    if (at_ < s_.size()) bad("text after the header's JSON object");
    return v;
  }

 private:
  // Deep enough for any header; bounds the recursion a damaged file can ask for.
  static constexpr int kMaxDepth = 32;

  [[noreturn]] void bad(const std::string& what) const {
    fail(ZD_ERR_INVALID_ARGUMENT, where_ + ": not a safetensors header (" + what + " at byte " +
                                      std::to_string(at_) + ")");
  }
  void skip_space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) bad(std::string("'") + c + "' expected");
  }

  Json value(int depth) {
    if (depth > kMaxDepth) bad("nesting too deep");
    skip_space();
    if (at_ >= s_.size()) bad("a value expected");
    Json v;
    const char c = s_[at_];
    if (c == '{') {
      v.kind = Json::Kind::Object;
      ++at_;
      if (take('}')) return v;
      do {
        skip_space();
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::Kind::Array;
      ++at_;
      if (take(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::Kind::String;
      v.text = string();
    } else {
      const size_t from = at_;
      while (at_ < s_.size() && std::strchr("+-.0123456789eEtruefalsn", s_[at_])) ++at_;
      v.text = s_.substr(from, at_ - from);
      const bool number = !v.text.empty() && (v.text[0] == '-' || (v.text[0] >= '0' && v.text[0] <= '9'));
      if (v.text == "true" || v.text == "false") v.kind = Json::Kind::Bool;
      else if (v.text == "null") v.kind = Json::Kind::Null;
      else if (number) v.kind = Json::Kind::Number;
      else bad("a value expected");
    }
    return v;
  }

  unsigned hex4() {
    if (at_ + 4 > s_.size()) bad("a cut-off \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[at_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= static_cast<unsigned>(h - 'A' + 10);
      else bad("a bad \\u escape");
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    if (at_ >= s_.size() || s_[at_] != '"') bad("a string expected");
    ++at_;
    std::string out;
    while (true) {
      if (at_ >= s_.size()) bad("a cut-off string");
      const char c = s_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= s_.size()) bad("a cut-off escape");
      const char e = s_[at_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          // A surrogate pair (Python's json.dumps writes one for a character beyond U+FFFF).
          if (cp >= 0xD800 && cp < 0xDC00 && at_ + 1 < s_.size() && s_[at_] == '\\' && s_[at_ + 1] == 'u') {
            at_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) bad("a bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: bad(std::string("a bad escape \\") + e);
      }
    }
  }

  const std::string& s_;
  std::string where_;
  size_t at_ = 0;
};

// A non-negative integer of the header (an extent, an offset).
uint64_t json_count(const Json& v, const std::string& where, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = v.kind == Json::Kind::Number && !v.text.empty() && v.text[0] != '-'
                                   ? std::strtoull(v.text.c_str(), &end, 10)
                                   : 0;
  if (v.kind != Json::Kind::Number || v.text.empty() || v.text[0] == '-' || *end || errno)
    fail(ZD_ERR_INVALID_ARGUMENT, where + ": " + what + " is not a count ('" + v.text + "')");
  return n;
}

// The metadata value `key` (a JSON text inside a string, as zerod.torch
// writes lists there: safetensors metadata values are strings), parsed.
std::optional<Json> metadata_json(const Json* meta, const char* key, const std::string& where) {
  const Json* v = meta ? meta->find(key) : nullptr;
  if (!v) return std::nullopt;
  if (v->kind != Json::Kind::String) fail(ZD_ERR_INVALID_ARGUMENT, where + ": metadata " + key + " is not a string");
  return JsonParser(v->text, where + " (metadata " + key + ")").parse_document();
}

TorchTensor tensor_of(const std::string& name, const Json& t, uint64_t data_at, uint64_t data_bytes,
                      const std::string& where) {
  const Json *dtype = t.find("dtype"), *shape = t.find("shape"), *offsets = t.find("data_offsets");
  if (t.kind != Json::Kind::Object || !dtype || dtype->kind != Json::Kind::String || !shape ||
      shape->kind != Json::Kind::Array || !offsets || offsets->kind != Json::Kind::Array || offsets->items.size() != 2)
    fail(ZD_ERR_INVALID_ARGUMENT, where + ": tensor '" + name + "' lacks a dtype, shape or data_offsets");
  TorchTensor out;
  out.name = name;
  out.dtype = dtype->text;
  const size_t esz = safetensors_dtype_size(out.dtype);
  if (!esz)
    fail(ZD_ERR_INVALID_ARGUMENT,
         where + ": tensor '" + name + "' has dtype " + out.dtype + ", not one safetensors names");
  if (shape->items.size() > 64)
    fail(ZD_ERR_INVALID_ARGUMENT, where + ": tensor '" + name + "' has too many dimensions");
  uint64_t numel = 1;
  for (const Json& d : shape->items) {
    const uint64_t extent = json_count(d, where, "an extent of '" + name + "'");
    out.shape.push_back(static_cast<int64_t>(extent));
    numel = extent && numel > UINT64_MAX / extent ? UINT64_MAX : numel * extent;
  }
  const uint64_t begin = json_count(offsets->items[0], where, "an offset of '" + name + "'");
  const uint64_t end = json_count(offsets->items[1], where, "an offset of '" + name + "'");
  if (begin > end || end > data_bytes || numel > UINT64_MAX / esz || numel * esz != end - begin)
    fail(ZD_ERR_INVALID_ARGUMENT, where + ": tensor '" + name + "' (" + out.dtype + ", " +
                                      std::to_string(numel) + " elements) does not fill its bytes [" +
                                      std::to_string(begin) + ", " + std::to_string(end) + ") of the " +
                                      std::to_string(data_bytes) + " the file holds");
  out.offset = data_at + begin;
  out.bytes = end - begin;
  return out;
}

int64_t step_of(const Json* meta, const std::string& where) {
  const Json* step = meta ? meta->find("zerod_step") : nullptr;
  if (!step || step->kind != Json::Kind::String)
    fail(ZD_ERR_INVALID_ARGUMENT, where + ": no zerod_step in its metadata");
  char* end = nullptr;
  const long long v = std::strtoll(step->text.c_str(), &end, 10);
  if (step->text.empty() || *end || v < 0)
    fail(ZD_ERR_INVALID_ARGUMENT, where + ": a bad zerod_step '" + step->text + "'");
  return v;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// Little-endian integers of a zip record.
uint64_t le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool read_at(int fd, void* out, size_t n, uint64_t at) {
  auto* p = static_cast<char*>(out);
  while (n) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    at += static_cast<uint64_t>(r);
  }
  return true;
}

// Where a zip archive's central directory is (offset, entries), from its
// end record (and the zip64 one, which torch.save writes for big files).
std::optional<std::pair<uint64_t, uint64_t>> central_directory(int fd, uint64_t size) {
  const uint64_t tail = std::min<uint64_t>(size, 22 + 0xFFFF);  // the end record and the longest comment
  std::vector<unsigned char> b(tail);
  if (tail < 22 || !read_at(fd, b.data(), tail, size - tail)) return std::nullopt;
  for (size_t i = tail - 22 + 1; i-- > 0;) {
    if (le(&b[i], 4) != 0x06054b50) continue;
    uint64_t entries = le(&b[i + 10], 2), offset = le(&b[i + 16], 4);
    if ((entries == 0xFFFF || offset == 0xFFFFFFFF) && i >= 20 && le(&b[i - 20], 4) == 0x07064b50) {
      unsigned char z[56];
      if (!read_at(fd, z, sizeof z, le(&b[i - 20 + 8], 8)) || le(z, 4) != 0x06064b50) return std::nullopt;
      entries = le(z + 32, 8);
      offset = le(z + 48, 8);
    }
    return std::make_pair(offset, entries);
  }
  return std::nullopt;
}

// Whether a zip entry name is one of torch.save's storages: <archive>/data/<n>.
bool is_storage(const std::string& name) {
  const size_t slash = name.rfind('/');
  if (slash == std::string::npos || slash + 1 == name.size()) return false;
  const std::string last = name.substr(slash + 1), dir = name.substr(0, slash);
  return std::all_of(last.begin(), last.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         (dir == "data" || dir.ends_with("/data"));
}

// `from` copied to `to` through a temporary file beside it, flushed and
// renamed: `to` is the old file or the whole copy.
void copy_synced(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) fail(ZD_ERR_IO, "reading " + from + ": " + errno_text(errno));
  const std::string tmp = to + ".tmp";
  const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    fail(ZD_ERR_IO, "creating " + tmp + ": " + errno_text(err));
  }
  std::vector<char> buf(size_t{1} << 20);
  std::string failed;
  while (failed.empty()) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failed = "reading " + from + ": " + errno_text(errno);
    if (n <= 0) break;
    for (ssize_t done = 0; done < n && failed.empty();) {
      const ssize_t w = ::write(out, buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) failed = "writing " + tmp + ": " + errno_text(errno);
      else done += w;
    }
  }
  if (failed.empty() && ::fsync(out) != 0) failed = "flushing " + tmp + ": " + errno_text(errno);
  ::close(in);
  ::close(out);
  if (failed.empty() && ::rename(tmp.c_str(), to.c_str()) != 0)
    failed = "renaming " + tmp + " to " + to + ": " + errno_text(errno);
  if (!failed.empty()) {
    ::unlink(tmp.c_str());
    fail(ZD_ERR_IO, failed);
  }
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::pair<const char*, size_t> kSizes[] = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4}, {"F16", 2}, {"BF16", 2},
      {"I16", 2}, {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, size] : kSizes)
    if (dtype == name) return size;
  return 0;
}

TorchTensors read_torch_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ZD_ERR_IO, "cannot read " + path + ": " + errno_text(errno));
  uint64_t len = 0;
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || !in.read(reinterpret_cast<char*>(&len), 8) || len > size - 8 || len > (uint64_t{1} << 30))
    fail(ZD_ERR_INVALID_ARGUMENT, path + ": not a safetensors file (a header of " + std::to_string(len) +
                                      " bytes in a file of " + std::to_string(size) + ")");
  std::string text(len, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(len))) fail(ZD_ERR_IO, "reading " + path + ": cut off");
  const Json header = JsonParser(text, path).parse_document();
  if (header.kind != Json::Kind::Object) fail(ZD_ERR_INVALID_ARGUMENT, path + ": its header is not an object");
  TorchTensors out;
  out.path = path;
  const Json* meta = header.find("__metadata__");
  out.step = step_of(meta, path);
  for (const auto& [name, t] : header.members)
    if (name != "__metadata__") out.tensors.push_back(tensor_of(name, t, 8 + len, size - 8 - len, path));
  if (const auto scalars = metadata_json(meta, "zerod_scalar_parameters", path)) {
    if (scalars->kind != Json::Kind::Array)
      fail(ZD_ERR_INVALID_ARGUMENT, path + ": metadata zerod_scalar_parameters is not a list");
    for (const Json& name : scalars->items) out.scalar_params.push_back(name.text);
  }
  if (const auto n = metadata_json(meta, "zerod_pickled_only", path))
    out.pickled_only = json_count(*n, path, "zerod_pickled_only");
  return out;
}

std::optional<TorchTensors> torch_tensors_of(const std::string& dir, int64_t step) {
  for (const char* name : {kTorchStateTensors, kTorchStateTensorsStaged}) {
    const std::string path = dir + "/" + name;
    if (!exists(path)) continue;
    TorchTensors t = read_torch_tensors(path);
    if (t.step == step) return t;
  }
  return std::nullopt;
}

uint64_t pickled_tensor_count(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  const auto cd = ec ? std::nullopt : central_directory(fd, size);
  if (!cd) return 0;
  uint64_t at = cd->first, count = 0;
  for (uint64_t i = 0; i < cd->second; ++i) {
    unsigned char h[46];
    if (!read_at(fd, h, sizeof h, at) || le(h, 4) != 0x02014b50) return count;
    const uint64_t name_len = le(h + 28, 2), extra = le(h + 30, 2), comment = le(h + 32, 2);
    std::string name(name_len, '\0');
    if (!read_at(fd, name.data(), name_len, at + 46)) return count;
    count += is_storage(name) ? 1 : 0;
    at += 46 + name_len + extra + comment;
  }
  return count;
}

StagedTorchState stage_torch_state(const std::string& from_dir, int64_t step, const std::string& out_dir) {
  const std::optional<TorchTensors> tensors = torch_tensors_of(from_dir, step);
  // The pickle saved with them: save_checkpoint renames the pickle before
  // the tensors, so a staged tensors file of the step beside a staged
  // pickle means the staged pickle is of the step too; otherwise the
  // committed one is. A checkpoint from before torch_state.safetensors
  // (or `zerod ckpt import`'s) has its pickle alone, whose step only
  // torch can read: its committed one, else a staged one (load_checkpoint
  // checks the step and names a mismatch).
  const std::string staged_pickle = from_dir + "/" + kTorchStatePickleStaged;
  const bool tensors_staged = tensors && fs::path(tensors->path).filename() == kTorchStateTensorsStaged;
  std::string pickle = from_dir + "/" + kTorchStatePickle;
  if ((tensors_staged && exists(staged_pickle)) || (!tensors && !exists(pickle))) pickle = staged_pickle;
  StagedTorchState staged;
  if (exists(pickle)) {
    copy_synced(pickle, out_dir + "/" + kTorchStatePickleStaged);
    staged.pickle = true;
  }
  if (tensors) {
    copy_synced(tensors->path, out_dir + "/" + kTorchStateTensorsStaged);
    staged.tensors = true;
  }
  return staged;
}

void commit_torch_state(const std::string& out_dir, const StagedTorchState& staged) {
  auto at = [&](const char* name) { return out_dir + "/" + name; };
  auto commit = [&](bool copied, const char* from, const char* to) {
    if (copied) {
      if (::rename(at(from).c_str(), at(to).c_str()) != 0)
        fail(ZD_ERR_IO, "renaming " + at(from) + " to " + at(to) + ": " + errno_text(errno));
    } else {
      ::unlink(at(from).c_str());
      ::unlink(at(to).c_str());
    }
  };
  commit(staged.pickle, kTorchStatePickleStaged, kTorchStatePickle);
  commit(staged.tensors, kTorchStateTensorsStaged, kTorchStateTensors);
  sync_dir(out_dir);
}

}  // namespace zerod::ckpt
