#include "memory/residency.h"

#include "memory/memory.h"
#include "memory/transfers.h"
#include "runtime/dtype.h"
#include "error.h"
#include "log.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace zerod {

void Residency::reset() {
  clear();
  modules_.assign(ctx_.registry.modules().size(), ModuleEntry{});
  params_.assign(ctx_.registry.params().size(), Block{});
}

void Residency::clear() {
  for (Block& b : params_) {
    if (b) res_.device->release(b, ZD_MEM_PARAMS);
    b = Block{};
  }
  for (ModuleEntry& m : modules_) m = ModuleEntry{};
  trace_ = Trace{};
  live_elems_ = 0;
  gathered_bytes_ = 0;
  unsettled_ = Unsettled{};
}

// The rank's shard of p, where the all-gather reads it: in place, sent by
// its segment's memory, when it lies in one memory segment; else (on NVMe,
// or across segments: each is an allocation of its own) copied out into a
// host buffer first.
void Residency::all_gather(zd_param_id pid, void* dst, CommOp op, uint64_t group, const std::string& what) {
  const ParamRecord& p = ctx_.registry.param(pid);
  const TieredBuffer& w = buffers_.of(p).working;
  std::vector<std::byte> staged;
  const void* send;
  const Memory* from = &res_.host_memory;
  if (w.in_one_segment(p.flat_offset, p.stride)) {
    send = w.addr(p.flat_offset);
    from = w.segment_at(p.flat_offset).memory;
  } else {
    staged.resize(p.stride * dtype_size(p.dtype));
    w.read(res_.tiers(), p.flat_offset, p.stride, staged.data());
    send = staged.data();
  }
  res_.pool_memory.all_gather(ctx_, ctx_.comm_call(res_.rank, comm_tag(op, group, static_cast<uint64_t>(pid)), what),
                              *from, send, dst, p.stride, p.dtype);
}

bool Residency::copy_whole(const std::vector<zd_param_id>& pids, const observe::EventArgs& a,
                           const std::function<void()>& first) {
  if (!whole_copy_ || pids.empty()) return false;
  std::vector<WholeValue> src;
  for (zd_param_id pid : pids) {
    const ParamRecord& p = ctx_.registry.param(pid);
    const WholeValue w = p.dtype == ZD_DTYPE_F32 ? whole_copy_(p) : WholeValue{};
    if (w.at == nullptr) return false;
    src.push_back(w);
  }
  if (first) first();
  observe::Span span(res_.probe, "residency", "copy whole", a);
  for (size_t i = 0; i < pids.size(); ++i) {
    const ParamRecord& p = ctx_.registry.param(pids[i]);
    auto* dst = static_cast<std::byte*>(params_[static_cast<size_t>(pids[i])].ptr);
    const uint64_t n = static_cast<uint64_t>(p.numel), padded = gathered_elems(p);
    // The whole value where the host reads it (itself, or a host copy).
    const HostWindow whole(*src[i].memory, const_cast<float*>(src[i].at), n * 4, HostWindow::kRead);
    res_.device->copy_to_device(dst, whole.data(), n * 4);
    // The padding after the last shard, as the shards hold it: zeros.
    if (padded > n) res_.device->zero(dst + n * 4, (padded - n) * 4);
  }
  return true;
}

// What the local plugin's all-gather of p writes into its gathered copy:
// every rank's shard (padding included), in rank order.
void Residency::copy_shards(const ShardBoard& board, zd_param_id pid) {
  const ParamRecord& p = ctx_.registry.param(pid);
  const size_t bytes = p.stride * dtype_size(p.dtype);
  auto* dst = static_cast<std::byte*>(params_[static_cast<size_t>(pid)].ptr);
  for (int q = 0; q < ctx_.world_size; ++q)
    std::memcpy(dst + static_cast<size_t>(q) * bytes, board.shard(q, pid), bytes);
}

void Residency::check_agreement(ShardBoard& board, zd_module_id m, uint64_t k) {
  if (!board.all_arrived(k)) board.await_arrival(res_.rank, k, "gathering " + ctx_.module_label(m));
  uint64_t other = 0;
  const int q = board.disagreeing(res_.rank, k, static_cast<uint64_t>(m), &other);
  if (q < 0) return;
  // As the local plugin words a disagreement, the lower rank first.
  const int r = res_.rank;
  const std::string mine = "\"gathering " + ctx_.module_label(m) + "\"";
  const std::string theirs = "\"gathering " + ctx_.module_label(static_cast<zd_module_id>(other)) + "\"";
  fail(ZD_ERR_INVALID_STATE, "ranks disagree at gather #" + std::to_string(k + 1) + ": rank " +
                                 std::to_string(std::min(r, q)) + " is in " + (r < q ? mine : theirs) + ", rank " +
                                 std::to_string(std::max(r, q)) + " is in " + (r < q ? theirs : mine));
}

void Residency::copy_module(ShardBoard& board, const std::vector<zd_param_id>& todo, zd_module_id m, uint64_t k,
                            uint64_t epoch, bool defer) {
  // The version read is what makes the copy right; the arrival only lets
  // ranks that went different ways be told. Waiting for a peer's arrival
  // at every begin cost several us of a 15-20 us call through the daemon
  // (docs/daemon.md), so a begin leaves it to the rank's next call.
  const bool compare_now = !defer || board.all_arrived(k);
  if (!board.readable(epoch)) board.await_readable(res_.rank, epoch, "gathering " + ctx_.module_label(m));
  if (compare_now) check_agreement(board, m, k);
  observe::RankCounters& counted = res_.probe.counters();
  for (zd_param_id pid : todo) {
    copy_shards(board, pid);
    // Counted as the plugin's all-gather of the parameter it replaces.
    const ParamRecord& p = ctx_.registry.param(pid);
    counted.count_direct(observe::RingCollective::all_gather, p.stride * dtype_size(p.dtype), ctx_.world_size);
  }
  if (!compare_now) unsettled_ = Unsettled{true, m, k};
}

void Residency::settle_gathers() {
  if (!unsettled_.pending) return;
  const Unsettled u = unsettled_;
  unsettled_.pending = false;  // settled once, whatever the outcome
  try {
    check_agreement(*ctx_.shards, u.module, u.gather);
  } catch (const Error& e) {
    ctx_.broken_by(e);
  }
}

bool Residency::allocate_gathered(const std::vector<zd_param_id>& todo, const std::string& what,
                                  std::vector<Block>* blocks, std::string* refusal) {
  blocks->clear();
  blocks->reserve(todo.size());
  try {
    for (zd_param_id pid : todo) {
      const ParamRecord& p = ctx_.registry.param(pid);
      // Every byte is written by the gather (shards with their padding).
      blocks->push_back(
          res_.device->allocate_for_overwrite(gathered_elems(p) * dtype_size(p.dtype), ZD_MEM_PARAMS, what));
    }
  } catch (const Error& e) {
    release_blocks(*blocks);
    blocks->clear();
    if (e.code() != ZD_ERR_BUDGET) throw;
    *refusal = e.what();
    return false;
  } catch (...) {
    release_blocks(*blocks);
    blocks->clear();
    throw;
  }
  return true;
}

void Residency::release_blocks(const std::vector<Block>& blocks) {
  for (const Block& b : blocks) res_.device->release(b, ZD_MEM_PARAMS);
}

uint64_t Residency::block_bytes(uint64_t bytes) {
  return (std::max<uint64_t>(bytes, 1) + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
}

// What gradients hold in the device tier at most while buckets are sent:
// the views of the contributions pending (up to a bucket per parameter
// group, and a module more: a full bucket sends every group's), the packed
// buckets (each parameter's padded shards from every rank) and the rank's
// parts of them; each block rounded as a device rounds it. The views hold
// the parameters' types, the buckets the gradients' accumulation type
// (GradReducer::send_bucket): fp32 accumulation of bf16 doubles them.
uint64_t Residency::bucket_reserve() const {
  uint64_t total = 0, largest = 0, params = 0;
  size_t view_esz = 1, bucket_esz = 1;
  for (const ModuleRecord& mod : ctx_.registry.modules()) {
    uint64_t n = 0;
    for (zd_param_id pid : mod.params) {
      const ParamRecord& p = ctx_.registry.param(pid);
      n += gathered_elems(p);
      view_esz = std::max(view_esz, dtype_size(p.dtype));
      const ParamGroup& g = ctx_.registry.groups()[static_cast<size_t>(p.group)];
      bucket_esz = std::max(bucket_esz, dtype_size(ctx_.grad_dtype(g)));
      ++params;
    }
    total += n;
    largest = std::max(largest, n);
  }
  const uint64_t bucket = ctx_.plugins.partitioner->bucket_elements();
  const auto groups = static_cast<uint64_t>(std::max<size_t>(1, ctx_.registry.groups().size()));
  const uint64_t pending = bucket >= total ? total : std::min(total, groups * bucket + largest);
  const auto world = static_cast<uint64_t>(ctx_.world_size);
  // Views, then per group a packed bucket and its part.
  return pending * view_esz + pending * bucket_esz + (pending * bucket_esz + world - 1) / world +
         (params + 2 * groups) * kBlockAlign;
}

void Residency::agree_prefetch_room(uint64_t planned) {
  // What the placement plans for the device tier, where a part of it comes
  // later (a compressing optimizer's buffers, at its first step).
  const uint64_t placed = std::max(res_.ledger.current(ZD_TIER_DEVICE, ZD_MEM_ALL), planned);
  const uint64_t budget = res_.ledger.budget(ZD_TIER_DEVICE);
  const uint64_t mine = budget == MemoryLedger::kNoBudget ? kNoRoomLimit
                                                          : std::min(kNoRoomLimit, budget - std::min(budget, placed));
  // The least room of any rank: the max of its negation (every plugin
  // reduces f64 by max; bytes below 2^53 are exact).
  double least = -static_cast<double>(mine);
  if (ctx_.world_size > 1) {
    const std::string what = "finalize: the device room every rank has for gathers ahead";
    ctx_.run(*res_.stream, [&] {
      ctx_.comm().all_reduce(ctx_.comm_call(res_.rank, comm_tag(CommOp::Finalize, 2, 0), what), &least, 1,
                             ZD_COMM_F64, ZD_REDUCE_MAX);
    });
  }
  const auto room = static_cast<uint64_t>(-least);
  if (room >= kNoRoomLimit) {
    room_ = kNoRoomLimit;
    return;
  }
  // The gradients' buffers need their part of it whatever is gathered.
  const uint64_t reserve = bucket_reserve();
  room_ = room > reserve ? room - reserve : 0;
  log_debug("rank " + std::to_string(res_.rank) + ": gathered copies stay within " + format_bytes(room_) +
            " of the device tier for gathers ahead (the least room of any rank beside its placed state, " +
            format_bytes(reserve) + " kept for gradient buckets)");
}

// Gathers a module's non-persistent parameters into fresh buffers on the
// rank's stream; the module counts as resident from now on.
bool Residency::gather(zd_module_id m, bool prefetch, bool await_shards) {
  const ModuleRecord& mod = ctx_.registry.module(m);
  ModuleEntry& me = modules_[static_cast<size_t>(m)];
  std::vector<zd_param_id> todo;
  uint64_t elems = 0, bytes = 0, need = 0;  // need: the bytes as the room counts them
  for (zd_param_id pid : mod.params) {
    const ParamRecord& p = ctx_.registry.param(pid);
    if (p.persistent || params_[static_cast<size_t>(pid)]) continue;
    todo.push_back(pid);
    elems += gathered_elems(p);
    bytes += gathered_elems(p) * dtype_size(p.dtype);
    need += block_bytes(gathered_elems(p) * dtype_size(p.dtype));
  }
  // Allocate everything first, so a module that does not fit is refused
  // whole, before any collective is issued. A gather ahead is admitted
  // while the gathered copies stay within the room the ranks agreed on,
  // counted alike on every rank (each block rounded as any device rounds
  // it): the answer is the same everywhere, and on the rank with the least
  // room it fits beside the gradients' reserve. When an allocation is
  // refused anyway (buffers beyond that reserve still out), the rank's
  // queued work gives its buffers back and it is tried again.
  if (prefetch && gathered_bytes_ + need > room_) return false;
  const std::string label = "gathering " + ctx_.module_label(m);
  std::vector<Block> blocks;
  std::string refusal;
  bool ok = allocate_gathered(todo, label, &blocks, &refusal);
  if (!ok && settle_) {
    settle_();
    ok = allocate_gathered(todo, label, &blocks, &refusal);
  }
  if (!ok) {
    if (prefetch) {
      // Within the room, so the gradients held more than their reserve
      // (several modules' buffers open at once): this rank may now gather
      // ahead other modules than the rest, which the next gathers would
      // report as a disagreement.
      const std::string line = "rank " + std::to_string(res_.rank) + ": " + ctx_.module_label(m) +
                               " was not gathered ahead, within the room the ranks agreed on: " + refusal;
      if (warned_refusal_) {
        log_debug(line);
      } else {
        log_warn(line + " (said once; the rest at debug level)");
        warned_refusal_ = true;
      }
      return false;
    }
    const uint64_t budget = res_.ledger.budget(ZD_TIER_DEVICE);
    fail(ZD_ERR_BUDGET, ctx_.module_label(m) + " needs " + format_bytes(bytes) +
                            " of gathered parameters in the device tier, which holds " +
                            format_bytes(res_.ledger.current(ZD_TIER_DEVICE, ZD_MEM_ALL)) +
                            (budget == MemoryLedger::kNoBudget ? std::string(" (no budget set)")
                                                               : " of its " + format_bytes(budget) + " budget") +
                            " on rank " + std::to_string(res_.rank) + " (" + refusal + ")");
  }
  gathered_bytes_ += need;
  for (size_t i = 0; i < todo.size(); ++i) params_[static_cast<size_t>(todo[i])] = blocks[i];
  live_elems_ += elems;
  me.resident = true;
  me.written = false;
  me.ready.reset();
  if (todo.empty()) return true;
  // Where the gather's device work ends, for the trainer's wait: marked by
  // the thread that issues that work, right after it.
  auto ready = std::make_shared<uint64_t>(kWholeStream);
  me.ready = ready;
  Device* device = res_.device.get();
  auto mark_ready = [device, ready] { *ready = device->mark(); };
  observe::EventArgs a;
  a.module = m;
  a.bytes = bytes;
  a.flags = prefetch ? observe::kFlagPrefetched : 0;
  if (prefetch) res_.probe.instant("residency", "prefetch", a);
  // Whatever reads the shards first waits until they are written.
  std::function<void()> shards_written;
  if (await_shards) shards_written = [await = gate_.await, m] { await(m); };
  // Stage 3 with compression.replay: this rank holds the current values.
  // (A compressing optimizer's update never overlaps the forward, so that
  // wait is not taken here in practice; it would be on the rank's thread.)
  if (copy_whole(todo, a, shards_written)) {
    mark_ready();
    return true;
  }
  ShardBoard* board = ctx_.shards;
  bool one_sided = board != nullptr;
  for (size_t i = 0; i < todo.size() && one_sided; ++i) one_sided = board->one_sided(todo[i]);
  if (one_sided) {
    // The peers' shards are in this process: copied here, no collective.
    // The version this rank reads is fixed now, in its program order.
    const uint64_t epoch = board->epoch(res_.rank);
    const uint64_t k = board->arrive(res_.rank, static_cast<uint64_t>(m));
    if (prefetch) {
      me.gather = ctx_.issue(*res_.stream, [this, board, todo, m, a, k, epoch, shards_written, mark_ready] {
        if (shards_written) shards_written();
        observe::Span span(res_.probe, "residency", "gather", a);
        copy_module(*board, todo, m, k, epoch, false);
        mark_ready();
      });
      return true;
    }
    // Needed now: the begin call copies it itself, without a hand-off to
    // the stream's thread and back.
    observe::Span span(res_.probe, "residency", "gather", a);
    try {
      copy_module(*board, todo, m, k, epoch, true);
      mark_ready();
    } catch (const Error& e) {
      ctx_.broken_by(e);
    }
    return true;
  }
  auto what = std::make_shared<std::string>("gathering " + ctx_.module_label(m) + ": all-gather");
  me.gather = ctx_.issue(*res_.stream, [this, todo, what, m, a, shards_written, mark_ready] {
    if (shards_written) shards_written();
    observe::Span span(res_.probe, "residency", "gather", a);
    for (zd_param_id pid : todo) {
      all_gather(pid, params_[static_cast<size_t>(pid)].ptr, CommOp::Gather, static_cast<uint64_t>(m), *what);
    }
    mark_ready();
  });
  return true;
}

void Residency::release(zd_module_id m) {
  ModuleEntry& me = modules_[static_cast<size_t>(m)];
  if (!me.resident) return;
  for (zd_param_id pid : ctx_.registry.module(m).params) {
    const ParamRecord& p = ctx_.registry.param(pid);
    Block& b = params_[static_cast<size_t>(pid)];
    if (p.persistent || !b) continue;
    res_.device->release(b, ZD_MEM_PARAMS);
    b = Block{};
    live_elems_ -= gathered_elems(p);
    gathered_bytes_ -= block_bytes(gathered_elems(p) * dtype_size(p.dtype));
  }
  me.resident = false;
  me.written = false;
  me.gather = CommStream::Ticket{};
  me.ready.reset();
  observe::EventArgs a;
  a.module = m;
  res_.probe.instant("residency", "release", a);
}

void Residency::release_all() {
  for (size_t m = 0; m < modules_.size(); ++m) release(static_cast<zd_module_id>(m));
}

void Residency::forget_gathered() {
  ctx_.drain(*res_.stream);
  release_all();
}

void Residency::gather_persistent() {
  std::vector<zd_param_id> persistent;
  for (size_t i = 0; i < ctx_.registry.params().size(); ++i)
    if (ctx_.registry.params()[i].persistent) persistent.push_back(static_cast<zd_param_id>(i));
  if (persistent.empty()) return;
  for (zd_param_id pid : persistent) {
    Block& b = params_[static_cast<size_t>(pid)];
    if (b) continue;
    const ParamRecord& p = ctx_.registry.param(pid);
    b = res_.device->allocate_for_overwrite(gathered_elems(p) * dtype_size(p.dtype), ZD_MEM_PARAMS,
                              "persistent parameter '" + p.name + "'");
  }
  if (copy_whole(persistent, observe::EventArgs{}, nullptr)) return;
  const std::string what = "gathering the persistent parameters: all-gather";
  ctx_.run(*res_.stream, [&] {
    for (zd_param_id pid : persistent) {
      all_gather(pid, params_[static_cast<size_t>(pid)].ptr, CommOp::Persistent, 0, what);
    }
  });
}

void Residency::refresh_persistent() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Block& b = params_[i];
    if (ctx_.registry.params()[i].persistent && b) {
      res_.device->release(b, ZD_MEM_PARAMS);
      b = Block{};
    }
  }
  gather_persistent();
}

void Residency::restart() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Block& b = params_[i];
    if (b && !ctx_.registry.params()[i].persistent) {
      res_.device->release(b, ZD_MEM_PARAMS);
      b = Block{};
    }
  }
  for (ModuleEntry& m : modules_) m = ModuleEntry{};
  trace_ = Trace{};
  live_elems_ = 0;
  gathered_bytes_ = 0;
  unsettled_ = Unsettled{};
}

void Residency::start_micro_batch() {
  trace_.complete = true;
  trace_.valid = true;
  trace_.pos = 0;
}

void Residency::make_resident(zd_module_id m, bool backward) {
  ModuleEntry& me = modules_[static_cast<size_t>(m)];
  const bool ahead = me.resident;  // gathered, or on its way, since before this call
  if (!me.resident) gather(m, false);
  Trace& tr = trace_;
  if (!tr.complete) {
    tr.order.emplace_back(backward, m);
  } else if (tr.valid) {
    if (tr.pos < tr.order.size() && tr.order[tr.pos] == std::make_pair(backward, m)) {
      ++tr.pos;
      // Prefetch: what follows in the recorded order, while the budget lasts.
      const uint64_t budget = ctx_.plugins.partitioner->prefetch_elements();
      const uint64_t max_live = ctx_.plugins.partitioner->max_live_elements();
      uint64_t fetched = 0;
      for (size_t j = tr.pos; j < tr.order.size() && fetched < budget; ++j) {
        const zd_module_id next = tr.order[j].second;
        if (modules_[static_cast<size_t>(next)].resident) continue;
        uint64_t elems = 0;
        for (zd_param_id pid : ctx_.registry.module(next).params) {
          const ParamRecord& p = ctx_.registry.param(pid);
          if (!p.persistent) elems += gathered_elems(p);
        }
        if (live_elems_ + elems > max_live) break;
        // Its shards may still be being updated (OverlappedUpdate): then
        // its gather waits for them on the stream. Stopping here instead
        // made what is gathered ahead depend on the update's pace, which
        // differs between ranks.
        const bool await_shards = gate_.ready && !gate_.ready(next);
        // Past the agreed room: the begin call will gather it.
        if (!gather(next, true, await_shards)) break;
        fetched += elems;
      }
    } else {
      // The module order changed: no more prefetch in this micro-batch.
      tr.valid = false;
      log_debug("rank " + std::to_string(res_.rank) + ": " + ctx_.module_label(m) +
                " begun out of the recorded order; prefetch off until the next micro-batch");
    }
  }
  // The time the trainer waits here for its parameters is what prefetch
  // exists to hide.
  observe::RankCounters& c = res_.probe.counters();
  observe::EventArgs a;
  a.module = m;
  a.flags = ahead ? observe::kFlagPrefetched : 0;
  observe::Span wait(res_.probe, "residency", "gather wait", a, &c.gather_wait_ns);
  ctx_.wait(me.gather);
  observe::add_relaxed(ahead ? c.gathers_ready : c.gathers_waited, 1);
  trainer_waits(me, backward && ahead);
}

void Residency::trainer_waits(const ModuleEntry& me, bool whole_stream) {
  // Read after make_resident waited for the gather's ticket: its thread
  // wrote the mark before the ticket completed.
  const uint64_t mark = me.ready ? *me.ready : kWholeStream;
  if (whole_stream || mark == kWholeStream || me.written) {
    res_.device->trainer_waits();
    return;
  }
  res_.device->trainer_waits_for(mark);
}

void Residency::overwrite(zd_param_id pid, const float* whole) {
  const ParamRecord& p = ctx_.registry.param(pid);
  const Block& b = params_[static_cast<size_t>(pid)];
  if (!b) return;
  const auto numel = static_cast<uint64_t>(p.numel);
  std::vector<std::byte> w(numel * dtype_size(p.dtype));
  convert(whole, ZD_DTYPE_F32, w.data(), p.dtype, numel);
  res_.device->copy_to_device(b.ptr, w.data(), w.size());
  // The module's gather, if it was gathered ahead, ended before this copy.
  if (p.module >= 0) modules_[static_cast<size_t>(p.module)].written = true;
}

}  // namespace zerod
