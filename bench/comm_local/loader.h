// The local comm plugin as the engine loads it: dlopen'ed from the plugin
// folder and reached through its v2 descriptor; one instance per world size.
#ifndef ZEROD_BENCH_COMM_LOADER_H
#define ZEROD_BENCH_COMM_LOADER_H

#include <zerod/zerod_plugin.h>

#include <string>

namespace zerod::bench {

class LocalComm {
 public:
  // On failure desc() is NULL and error() says why.
  LocalComm(const std::string& plugin_dir, int world, double spin_us);
  ~LocalComm();
  LocalComm(const LocalComm&) = delete;
  LocalComm& operator=(const LocalComm&) = delete;

  const zd_comm_v2* desc() const { return desc_; }
  void* inst() const { return inst_; }
  const std::string& error() const { return error_; }

 private:
  void* handle_ = nullptr;
  const zd_comm_v2* desc_ = nullptr;
  void* inst_ = nullptr;
  std::string error_;
};

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_COMM_LOADER_H
