#include "tier_run.h"

#include <dlfcn.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace zerod::bench {
namespace {

// A pattern that differs per 8-byte word, so a block landing at the wrong
// offset is caught.
uint64_t word(uint64_t i) { return (i + 1) * 0x9E3779B97F4A7C15ull; }

}  // namespace

TierRun::TierRun(const std::string& plugin_dir, const Settings& s) : size_(s.size) {
  const std::string path = plugin_dir + "/zd_tier_nvme.so";
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    error_ = dlerror();
    return;
  }
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle_, ZD_PLUGIN_ENTRY_SYMBOL));
  for (const zd_plugin_header* const* h = entry ? entry() : nullptr; h != nullptr && *h != nullptr; ++h) {
    if ((*h)->kind == ZD_PLUGIN_TIER && (*h)->abi_version == ZD_TIER_ABI_VERSION) {
      desc_ = reinterpret_cast<const zd_tier_v1*>(*h);
    }
  }
  if (desc_ == nullptr) {
    error_ = "no tier descriptor in " + path;
    return;
  }
  std::vector<double> values;
  for (uint32_t i = 0; i < desc_->hparam_count; ++i) {
    const zd_hparam_spec& spec = desc_->hparams[i];
    double v = spec.defaults[0];
    if (std::strcmp(spec.name, "block_size") == 0) v = static_cast<double>(s.block_size);
    if (std::strcmp(spec.name, "queue_depth") == 0) v = static_cast<double>(s.queue_depth);
    values.push_back(v);
  }
  const char* paths[] = {s.dir.c_str()};
  zd_tier_config config{};
  config.struct_size = sizeof config;
  config.world_size = 1;
  config.paths = paths;
  config.path_count = 1;
  char err[1024] = "";
  if (desc_->create(nullptr, values.data(), values.size(), &config, &inst_, err, sizeof err) != ZD_OK) {
    error_ = err;
    return;
  }
  if (desc_->reserve(inst_, size_, "bench", &offset_, err, sizeof err) != ZD_OK) {
    error_ = err;
    return;
  }
  // mmap: page-aligned, and the pages are faulted in below, not while timing.
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    error_ = "cannot map a " + std::to_string(size_) + "-byte buffer";
    return;
  }
  buffer_ = static_cast<unsigned char*>(p);
  auto* words = reinterpret_cast<uint64_t*>(buffer_);
  for (uint64_t i = 0; i < size_ / 8; ++i) words[i] = word(i);
}

TierRun::~TierRun() {
  if (inst_ != nullptr) desc_->destroy(inst_);
  if (buffer_ != nullptr) munmap(buffer_, size_);
  if (handle_ != nullptr) dlclose(handle_);
}

std::string TierRun::describe() const {
  char buf[1024] = "";
  if (inst_ != nullptr) desc_->describe(inst_, buf, sizeof buf);
  return buf;
}

double TierRun::transfer(bool write) {
  zd_tier_io io{offset_, size_, buffer_, write ? 1 : 0, 0};
  uint64_t ticket = 0;
  char err[1024] = "";
  const auto t0 = std::chrono::steady_clock::now();
  if (desc_->submit(inst_, &io, 1, &ticket, err, sizeof err) != ZD_OK ||
      desc_->wait(inst_, ticket, err, sizeof err) != ZD_OK) {
    error_ = err;
    return -1;
  }
  const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  return static_cast<double>(size_) / dt.count();
}

double TierRun::write() { return transfer(true); }

double TierRun::read() {
  std::memset(buffer_, 0, size_);  // so verify() sees what the read brought
  return transfer(false);
}

bool TierRun::verify() const {
  const auto* words = reinterpret_cast<const uint64_t*>(buffer_);
  for (uint64_t i = 0; i < size_ / 8; ++i) {
    if (words[i] != word(i)) return false;
  }
  return true;
}

}  // namespace zerod::bench
