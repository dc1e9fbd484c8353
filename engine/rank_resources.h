// What one rank computes and stores with: its byte ledger, its device (the
// device tier's pool and the work done on it), its host and NVMe tier
// instances when the placement uses them, its CPU workers, and the stream
// its collectives run on in program order.
#pragma once

#include "comm_stream.h"
#include "device/device.h"
#include "ledger.h"
#include "observe/probe.h"
#include "plugin_host.h"
#include "tiered_buffer.h"
#include "workers.h"

#include <memory>

namespace zerod {

struct RankResources {
  RankResources(int r, ThreadPool& shared, std::mutex& shared_mu) : rank(r), probe(r), workers(shared, shared_mu) {}

  const int rank;
  observe::RankProbe probe;  // the rank's counters and trace events
  MemoryLedger ledger;
  Workers workers;
  std::unique_ptr<Device> device;
  std::unique_ptr<TierInstance> host;  // when the placement uses host memory
  std::unique_ptr<TierInstance> nvme;  // when it uses NVMe
  std::unique_ptr<CommStream> stream;

  TierSet tiers() { return TierSet{device.get(), host.get(), nvme.get(), &ledger, &probe}; }
};

}  // namespace zerod
