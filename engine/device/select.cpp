#include "select.h"

#include "cpu_device.h"
#include "emulated_device.h"
#include "error.h"

#if defined(ZEROD_HAVE_CUDA)
#include "cuda_device.h"
#endif

namespace zerod {

namespace {
// Each memfd arena of the cpu pool: large enough that a model needs few of
// them (each is one fd passed to a daemon's trainers), small enough that a
// tiny job does not reserve much.
constexpr uint64_t kCpuChunk = uint64_t{64} << 20;
// The emulated device's address space per rank (sparse: only what blocks
// use is touched); what tests of a daemon on it need.
constexpr uint64_t kEmulatedSpace = uint64_t{1} << 30;
}  // namespace

CudaAvailability cuda_availability() {
#if defined(ZEROD_HAVE_CUDA)
  return cuda_probe();
#else
  CudaAvailability a;
  a.why = "this libzerod was built without CUDA (nvcc was not found when it was configured)";
  return a;
#endif
}

std::string resolve_device(const std::string& request, const std::string& source) {
  if (request == "cpu" || request == "emulated") return request;
  if (request != "cuda" && request != "auto")
    fail(ZD_ERR_CONFIG, source + ": device = \"" + request + "\" is not a device; use \"cpu\", \"cuda\" or \"auto\"");
  const CudaAvailability a = cuda_availability();
  if (a.devices > 0) return "cuda";
  if (request == "auto") return "cpu";
  fail(ZD_ERR_CONFIG, source + ": device = \"cuda\", but " + a.why +
                          "; set device = \"cpu\" (or \"auto\") to train on the CPU");
}

std::unique_ptr<Device> open_device(const std::string& kind, MemoryLedger& ledger, Workers& workers, int local_rank,
                                    const std::string& name) {
  if (kind == "cpu") return std::make_unique<CpuDevice>(ledger, workers, kCpuChunk, name);
  if (kind == "emulated")
    fail(ZD_ERR_CONFIG, "device = \"emulated\" (a stand-in for a GPU in tests) serves the ranks of a daemon only: "
                        "an embedded trainer's views would be memory it cannot read; run under `zerod run`, or "
                        "use device = \"cpu\"");
#if defined(ZEROD_HAVE_CUDA)
  if (kind == "cuda") return make_cuda_device(ledger, workers, local_rank, name);
#else
  (void)local_rank;
#endif
  fail(ZD_ERR_CONFIG, "device \"" + kind + "\" cannot be opened: " + cuda_availability().why);
}

std::unique_ptr<Device> open_shared_device(const std::string& kind, MemoryLedger& ledger, Workers& workers,
                                           int local_rank, const std::string& name) {
  if (kind == "emulated") return std::make_unique<EmulatedDevice>(ledger, workers, /*exported=*/true, name, kEmulatedSpace);
#if defined(ZEROD_HAVE_CUDA)
  if (kind == "cuda") return make_cuda_device(ledger, workers, local_rank, name, /*shared=*/true);
#endif
  return open_device(kind, ledger, workers, local_rank, name);
}

}  // namespace zerod
