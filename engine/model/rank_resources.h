// What one rank computes and stores with: its byte ledger, its device (the
// device tier's pool and the work done on it), its host and NVMe tier
// instances when the placement uses them, its CPU workers, the stream its
// collectives run on in program order, the memory object of each tier
// (memory.h), and the transfers between the pool and host memory.
#pragma once

#include "comm/comm_stream.h"
#include "device/device.h"
#include "memory/ledger.h"
#include "memory/memory.h"
#include "observe/probe.h"
#include "runtime/plugin_host.h"
#include "memory/tiered_buffer.h"
#include "memory/transfers.h"
#include "runtime/workers.h"

#include <atomic>
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
  // They reach the device and tiers above at each call (the device may be
  // replaced, wrapped for tracing, after they are made).
  PoolMemory pool_memory{*this};
  HostMemory host_memory{*this};
  NvmeMemory nvme_memory{*this};
  Transfers transfers{*this};  // its staging buffers go before the device

  TierSet tiers() {
    return TierSet{device.get(), host.get(), nvme.get(), &ledger, &probe, {&pool_memory, &host_memory, &nvme_memory}};
  }
  Memory& memory(zd_tier t) { return *tiers().memories[static_cast<size_t>(t)]; }

  // Gathers upload straight from working shards in host memory; whoever
  // writes those shards next (the optimizer) waits for the newest such
  // upload first. Tickets of one direction only grow.
  void note_shard_upload(uint64_t ticket) {
    uint64_t seen = shard_upload.load(std::memory_order_relaxed);
    while (ticket > seen && !shard_upload.compare_exchange_weak(seen, ticket, std::memory_order_relaxed)) {
    }
  }
  void wait_shard_uploads() { device->transfer_wait(shard_upload.load(std::memory_order_relaxed)); }
  std::atomic<uint64_t> shard_upload{0};
};

}  // namespace zerod
