#include "shard_file.h"

#include "crc32c.h"
#include "error.h"
#include "memory/ledger.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace zerod::ckpt {

namespace {

constexpr char kMagic[8] = {'Z', 'D', 'S', 'H', 'A', 'R', 'D', 0};
constexpr char kIndexMagic[8] = {'Z', 'D', 'S', 'H', 'I', 'D', 'X', 0};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 32, kEntry = 40, kFooter = 32;

void put32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void pread_all(int fd, void* dst, size_t n, uint64_t at, const std::string& path) {
  auto* p = static_cast<std::byte*>(dst);
  while (n) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(ZD_ERR_IO, "reading " + path + ": " + errno_text(errno));
    if (got == 0) fail(ZD_ERR_IO, path + " is cut off (" + std::to_string(at) + " bytes, more expected)");
    p += got;
    at += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

// Closes a descriptor at the end of its scope unless disarmed: a
// constructor's fd when the constructor throws (its destructor does not run
// then), so a daemon that meets many damaged shards, or a full disk at every
// snapshot, keeps no fd of theirs.
struct ClosesFd {
  int& fd;
  bool armed = true;
  ~ClosesFd() {
    if (armed && fd >= 0) {
      ::close(fd);
      fd = -1;
    }
  }
};

FileIdentity identity_of(const struct stat& st) {
  FileIdentity id;
  id.device = static_cast<uint64_t>(st.st_dev);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<uint64_t>(st.st_size);
  id.modified_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id;
}

}  // namespace

ShardWriter::ShardWriter(const std::string& path, int rank, int world_size, FileAccess access) : path_(path) {
  fd_ = open_to_write(path, O_WRONLY | O_TRUNC, access);
  ZD_CHECK_SYS(fd_, "creating the checkpoint shard " + path);
  ClosesFd guard{fd_};
  std::byte h[kHeader] = {};
  std::memcpy(h, kMagic, 8);
  put32(h + 8, kVersion);
  put32(h + 12, static_cast<uint32_t>(rank));
  put32(h + 16, static_cast<uint32_t>(world_size));
  write_all(h, sizeof h);
  guard.armed = false;
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardWriter::write_all(const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  while (n) {
    const ssize_t done = ::write(fd_, b, n);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0)
      fail(ZD_ERR_IO, "writing the checkpoint shard " + path_ + " (" + format_bytes(at_) + " written): " +
                          errno_text(errno));
    b += done;
    n -= static_cast<size_t>(done);
    at_ += static_cast<uint64_t>(done);
  }
}

void ShardWriter::begin(uint32_t param, uint32_t buffer, uint64_t first, uint64_t count) {
  if (open_) fail(ZD_ERR_INTERNAL, "checkpoint shard: a record begun inside another");
  Record r;
  r.param = param;
  r.buffer = buffer;
  r.first = first;
  r.count = count;
  r.offset = at_;
  index_.push_back(r);
  pending_ = count;
  open_ = true;
}

void ShardWriter::append(const float* values, uint64_t n) {
  if (!open_ || n > pending_) fail(ZD_ERR_INTERNAL, "checkpoint shard: more values than the record holds");
  Record& r = index_.back();
  r.crc = crc32c(r.crc, values, n * 4);
  write_all(values, n * 4);
  pending_ -= n;
}

void ShardWriter::end() {
  if (!open_ || pending_) fail(ZD_ERR_INTERNAL, "checkpoint shard: a record ended before all its values");
  open_ = false;
}

void ShardWriter::finish() {
  write_index();
  sync();
}

void ShardWriter::write_index() {
  const uint64_t index_at = at_;
  std::vector<std::byte> idx(index_.size() * kEntry);
  for (size_t i = 0; i < index_.size(); ++i) {
    std::byte* e = idx.data() + i * kEntry;
    const Record& r = index_[i];
    put32(e, r.param);
    put32(e + 4, r.buffer);
    put64(e + 8, r.first);
    put64(e + 16, r.count);
    put64(e + 24, r.offset);
    put32(e + 32, r.crc);
    put32(e + 36, 0);
  }
  write_all(idx.data(), idx.size());
  std::byte f[kFooter] = {};
  std::memcpy(f, kIndexMagic, 8);
  put64(f + 8, index_at);
  put64(f + 16, index_.size());
  put32(f + 24, crc32c(0, idx.data(), idx.size()));
  write_all(f, sizeof f);
}

void ShardWriter::sync() {
  if (::fsync(fd_) != 0) fail(ZD_ERR_IO, "flushing the checkpoint shard " + path_ + " to disk: " + errno_text(errno));
  ::close(fd_);
  fd_ = -1;
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ZD_ERR_IO, "the checkpoint shard " + path + " cannot be opened: " + errno_text(errno));
  ClosesFd closed_at_end{fd};  // the index is all that is kept: reads open the file again
  struct stat st {};
  ZD_CHECK_SYS(::fstat(fd, &st), "reading the size of " + path);
  identity_ = identity_of(st);
  const uint64_t size = identity_.size;
  if (size < kHeader + kFooter) fail(ZD_ERR_IO, path + " is not a whole checkpoint shard (" + std::to_string(size) + " bytes)");
  std::byte h[kHeader];
  pread_all(fd, h, kHeader, 0, path);
  if (std::memcmp(h, kMagic, 8) != 0) fail(ZD_ERR_IO, path + " is not a zerod checkpoint shard");
  if (get32(h + 8) > kVersion)
    fail(ZD_ERR_IO, path + " is of shard format " + std::to_string(get32(h + 8)) + ", newer than this zerod reads");
  rank_ = static_cast<int>(get32(h + 12));
  world_ = static_cast<int>(get32(h + 16));
  std::byte f[kFooter];
  pread_all(fd, f, kFooter, size - kFooter, path);
  if (std::memcmp(f, kIndexMagic, 8) != 0)
    fail(ZD_ERR_IO, path + " has no index at its end: it was not written to the end");
  const uint64_t index_at = get64(f + 8), count = get64(f + 16);
  if (count > (size - kHeader - kFooter) / kEntry || index_at + count * kEntry != size - kFooter)
    fail(ZD_ERR_IO, path + ": its index does not fit the file");
  std::vector<std::byte> idx(count * kEntry);
  pread_all(fd, idx.data(), idx.size(), index_at, path);
  if (crc32c(0, idx.data(), idx.size()) != get32(f + 24)) fail(ZD_ERR_IO, path + ": its index fails its checksum");
  index_.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const std::byte* e = idx.data() + i * kEntry;
    Record& r = index_[i];
    r.param = get32(e);
    r.buffer = get32(e + 4);
    r.first = get64(e + 8);
    r.count = get64(e + 16);
    r.offset = get64(e + 24);
    r.crc = get32(e + 32);
    if (r.count > (index_at - kHeader) / 4 || r.offset < kHeader || r.offset + r.count * 4 > index_at)
      fail(ZD_ERR_IO, path + ": record " + std::to_string(i) + " lies outside the file's data");
  }
}

int ShardReader::reopen() const {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail(ZD_ERR_IO, "the checkpoint shard " + path_ + " cannot be opened again to read its records: " +
                        errno_text(err) + (err == ENOENT ? " (it was removed after its index was read)" : ""));
  }
  ClosesFd guard{fd};
  struct stat st {};
  ZD_CHECK_SYS(::fstat(fd, &st), "reading the size of " + path_);
  // Records are found by the offsets of the index read earlier: in another
  // file they would be other bytes (which the checksums would call damage).
  if (identity_of(st) != identity_)
    fail(ZD_ERR_IO, "the checkpoint shard " + path_ +
                        " changed after its index was read (it was written again or replaced): its records are "
                        "not the ones the checkpoint was opened with");
  guard.armed = false;
  return fd;
}

std::vector<float> ShardReader::read(const Record& r, int fd) const {
  std::vector<float> v(r.count);
  pread_all(fd, v.data(), r.count * 4, r.offset, path_);
  if (crc32c(0, v.data(), r.count * 4) != r.crc)
    fail(ZD_ERR_IO, path_ + ": the record of parameter #" + std::to_string(r.param) + ", buffer " +
                        std::to_string(r.buffer) + ", elements " + std::to_string(r.first) + ".." +
                        std::to_string(r.first + r.count) + " fails its checksum: the file is damaged");
  return v;
}

}  // namespace zerod::ckpt
