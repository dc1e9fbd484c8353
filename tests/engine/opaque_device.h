// The emulated device (engine/device/emulated_device.h) as the engine tests
// open it in-process: private memory the host cannot address, views that
// say ZD_DEVICE_CUDA so no host code takes them for its own. The daemon's
// ranks open the same device with its memory exported (device = "emulated").
#pragma once

#include "device/emulated_device.h"

namespace zerod_test {

class OpaqueDevice final : public zerod::EmulatedDevice {
 public:
  OpaqueDevice(zerod::MemoryLedger& ledger, zerod::Workers& workers)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "opaque") {}
  const char* name() const override { return "opaque"; }
};

}  // namespace zerod_test
