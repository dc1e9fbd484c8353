// Stage 3 residency for one rank: a module's parameters are gathered from
// every rank's shard into whole working copies in the device tier at its
// begin call and released at its end; small ("persistent") parameters stay
// gathered. The modules the recorded order says come next are gathered
// ahead on the rank's stream (prefetch), while the gathered elements stay
// within the partitioner's live window (max_live_parameters) and the
// prefetch budget (prefetch_bucket_size). With every rank in this process
// on the local comm plugin, a gather copies the peers' shards directly
// (ShardBoard); the begin call does that itself, prefetches go on the
// stream. With compression.replay the rank holds every parameter's current
// value after a replayed step (copy_from), and a gather copies from there.
//
// Gathers are collectives (or one-sided copies checked for agreement), so
// every rank must gather ahead the same modules in the same order. Under a
// device budget, whether a module fits ahead cannot be each rank's own
// allocation succeeding: ranks differ in room (GPUs with different free
// memory, ranks sharing one) and in transient buffers still held (gradient
// buckets their stream or accumulator thread has not given back yet). So
// the ranks agree at finalize on the least room any of them has beside its
// placed state, less what gradient buckets need (agree_prefetch_room), and
// a module is gathered ahead only while the gathered copies, counted alike
// on every rank, stay within that room: the same answer on every rank.
#pragma once

#include "comm/comm_stream.h"
#include "comm/shard_board.h"
#include "model/model_context.h"
#include "model/rank_resources.h"
#include "memory/state_buffers.h"

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace zerod {

class Residency {
 public:
  Residency(const ModelContext& ctx, RankResources& res, StateBuffers& buffers)
      : ctx_(ctx), res_(res), buffers_(buffers) {}
  ~Residency() { clear(); }
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  // Where a rank holds a parameter's whole current fp32 value without a
  // gather (stage 3 with compression.replay: MomentumCompression's copy),
  // and the memory that holds it (a gather reads it through a HostWindow:
  // it may be in a pool the host cannot address), or {nullptr, nullptr}.
  // Every rank must answer alike: a gather then copies from it on all of
  // them, or all-gathers on all of them.
  struct WholeValue {
    const float* at = nullptr;
    const Memory* memory = nullptr;
  };
  using WholeCopy = std::function<WholeValue(const ParamRecord&)>;
  void copy_from(WholeCopy source) { whole_copy_ = std::move(source); }
  // When a module's shards may be read (OverlappedUpdate: once its update
  // is written). `ready` from the rank's thread: whether they may be read
  // now, with any device wait for them issued. `await` from zerod's stream:
  // waits until they may be, then issues that device wait. A module not
  // ready is still gathered ahead, its gather waiting on the stream: which
  // modules a rank gathers ahead, and in which order, must not depend on
  // how far its update has got, because the gathers are collectives that
  // every rank issues alike (ranks at different paces once disagreed).
  struct ShardsGate {
    std::function<bool(zd_module_id)> ready;
    std::function<void(zd_module_id)> await;
  };
  void prefetch_when(ShardsGate gate) { gate_ = std::move(gate); }
  // Waits until the rank's transient device buffers that queued work gives
  // back (gradient buckets being reduced or leaving for the host) are back:
  // asked for when a gather's allocation is refused while they are held.
  void settle_transients_with(std::function<void()> settle) { settle_ = std::move(settle); }

  // Sized for the registry, nothing gathered (at finalize).
  void reset();
  // A begin call: the module's parameters are resident when this returns
  // (the next modules may be on their way). Throws ZD_ERR_BUDGET, with
  // nothing allocated for it, when the device tier cannot hold them.
  // Then the trainer's stream waits for what it reads of m: its gather (a
  // mark right after the gather's device work), not the gathers of later
  // modules queued behind it. A backward's gradient views, zeroed on
  // zerod's stream by its begin call before this, come after a gather
  // issued ahead; the trainer then waits for all of zerod's work so far,
  // as it does where the gather's point is unknown or a parameter was
  // written since.
  void make_resident(zd_module_id m, bool backward);
  // An end call: the module's gathered (non-persistent) copies go.
  void release(zd_module_id m);
  void release_all();
  // Before the shards change between steps (a checkpoint load, the
  // working copies rebuilt): gathers in flight, which read them, end first,
  // and every gathered copy goes (one gathered ahead of its begin call
  // would keep the old values; its gather's mark would not cover what
  // refresh_persistent() writes after it).
  void forget_gathered();
  // Gathers the persistent parameters from the current shards (a
  // collective): at finalize; refresh_persistent() again after every step
  // and restart, when the shards have changed.
  void gather_persistent();
  void refresh_persistent();
  // At finalize, once the rank's state and persistent copies are placed (a
  // collective, stage 3): the ranks agree on the device-tier room for what
  // steps allocate, the least any rank's budget leaves beside its state
  // (what is placed, or `planned` by the placement where more: some comes
  // at the first step), less the gradients' reserve. Gathers ahead stay
  // within it (above).
  void agree_prefetch_room(uint64_t planned);
  // The recorded module order restarts from its beginning (every step);
  // the first step's order is the record.
  void start_micro_batch();
  // After a failed step (a restart): the modules' gathered copies and the
  // record go; the persistent copies stay until refresh_persistent().
  void restart();
  // Drops every gathered copy and the record.
  void clear();

  const Block& gathered(zd_param_id p) const { return params_[static_cast<size_t>(p)]; }
  bool resident(zd_param_id p) const { return static_cast<bool>(gathered(p)); }
  // Elements gathered now, persistent ones excluded.
  uint64_t live_elements() const { return live_elems_; }
  // zd_param_write of a parameter whose copy is gathered now.
  void overwrite(zd_param_id pid, const float* whole);
  // A begin call's one-sided gather copies as soon as its peers' shards are
  // at its version, without waiting for them to arrive at the same gather;
  // whether they gather the same module is settled here, at the start of
  // the rank's next call (Model::Call), waiting for them then if need be.
  // A disagreement breaks the job, as it would have at the begin.
  void settle_gathers();

 private:
  struct ModuleEntry {
    bool resident = false;      // gathered, or being gathered
    bool written = false;       // a gathered copy overwritten since (zd_param_write)
    CommStream::Ticket gather;  // the gather in flight
    // The device mark() right after the gather's work, written by whoever
    // issues it (the stream's thread, ahead) and read once the ticket is
    // waited for; kWholeStream until then, or where nothing was gathered.
    std::shared_ptr<uint64_t> ready;
  };
  static constexpr uint64_t kWholeStream = ~uint64_t{0};
  // The trainer's stream waits for me's gather's mark, or (whole_stream,
  // or no mark, or a copy written since) for all of zerod's work so far.
  void trainer_waits(const ModuleEntry& me, bool whole_stream);
  // The order modules were begun in the first micro-batch; later micro-
  // batches that follow it get the next modules gathered ahead.
  struct Trace {
    std::vector<std::pair<bool, zd_module_id>> order;  // (backward?, module)
    bool complete = false;
    bool valid = true;  // this micro-batch still follows it
    size_t pos = 0;
  };

  // prefetch: issued ahead of the module's begin call (the timeline says
  // so); await_shards: its shards are still being written, the gather waits
  // for them first (gate_.await). A prefetch that the agreed room does not
  // admit, or whose allocation is refused even so, gathers nothing and says
  // false.
  bool gather(zd_module_id m, bool prefetch, bool await_shards = false);
  // The gathered copies of `todo` in the device tier, all or none: false
  // when its budget refuses one (its words in *refusal; anything else
  // throws).
  bool allocate_gathered(const std::vector<zd_param_id>& todo, const std::string& what, std::vector<Block>* blocks,
                         std::string* refusal);
  void release_blocks(const std::vector<Block>& blocks);
  // A block of `bytes` as the room counts it: rounded up as the devices
  // round theirs (at most kBlockAlign), the same on every rank.
  static constexpr uint64_t kBlockAlign = 256;
  static uint64_t block_bytes(uint64_t bytes);
  // The device bytes gradients need at most while buckets are sent, kept
  // out of the room for gathers ahead.
  uint64_t bucket_reserve() const;
  uint64_t gathered_elems(const ParamRecord& p) const { return p.stride * static_cast<uint64_t>(ctx_.world_size); }
  // Copies p's shards from every rank into its gathered copy (one-sided);
  // copy_module those of module m's parameters todo at its gather #k, once
  // every rank's shards are at version `epoch` and, unless `defer`, every
  // rank has arrived there (with `defer` and a peer not there yet, the
  // comparison is left to settle_gathers()).
  void copy_shards(const ShardBoard& board, zd_param_id pid);
  void copy_module(ShardBoard& board, const std::vector<zd_param_id>& todo, zd_module_id m, uint64_t k,
                   uint64_t epoch, bool defer);
  // Waits until every rank has arrived at gather #k and fails
  // (ZD_ERR_INVALID_STATE) when one gathers another module there.
  void check_agreement(ShardBoard& board, zd_module_id m, uint64_t k);
  // Gathers p's shards from every rank into dst (on the rank's stream).
  void all_gather(zd_param_id pid, void* dst, CommOp op, uint64_t group, const std::string& what);
  // When every parameter of `pids` has a whole copy on this rank: copies
  // them into their gathered buffers and says true (no collective).
  // `first` runs before anything is copied.
  bool copy_whole(const std::vector<zd_param_id>& pids, const observe::EventArgs& a,
                  const std::function<void()>& first);

  const ModelContext& ctx_;
  RankResources& res_;
  StateBuffers& buffers_;
  WholeCopy whole_copy_;
  ShardsGate gate_;
  std::function<void()> settle_;
  static constexpr uint64_t kNoRoomLimit = uint64_t{1} << 60;  // no rank has a device budget
  uint64_t room_ = kNoRoomLimit;  // agreed at finalize
  uint64_t gathered_bytes_ = 0;   // the modules' gathered copies now, counted by block_bytes
  bool warned_refusal_ = false;   // a gather ahead refused within the room: said once
  std::vector<ModuleEntry> modules_;
  std::vector<Block> params_;  // the whole working copy while gathered
  Trace trace_;
  uint64_t live_elems_ = 0;
  struct Unsettled {
    bool pending = false;
    zd_module_id module = -1;
    uint64_t gather = 0;  // its number on the board
  } unsettled_;
};

}  // namespace zerod
