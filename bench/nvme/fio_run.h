// fio with the bench's settings: ioengine=libaio, direct=1, sequential,
// on a file in the same directory; its bandwidth from the JSON output.
#ifndef ZEROD_BENCH_NVME_FIO_RUN_H
#define ZEROD_BENCH_NVME_FIO_RUN_H

#include <string>

#include "tier_run.h"

namespace zerod::bench {

// "" when fio runs here, else why not.
std::string fio_missing();

class FioRun {
 public:
  explicit FioRun(const Settings& settings);
  ~FioRun();  // removes the file
  FioRun(const FioRun&) = delete;
  FioRun& operator=(const FioRun&) = delete;

  // Bytes per second, < 0 with error() on failure. write() first: read()
  // reads the file it wrote.
  double write() { return run("write"); }
  double read() { return run("read"); }
  const std::string& error() const { return error_; }

 private:
  double run(const char* rw);

  Settings s_;
  std::string file_;
  std::string error_;
};

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_NVME_FIO_RUN_H
