// The parameters and modules a trainer registered, and where each one sits
// in the per-group buffers.
//
// Parameters are grouped by working dtype (and, on a device the host cannot
// address, by whether their optimizer state stays on it:
// LayoutPolicy::group_class): one buffer per group, so the optimizer runs
// over long contiguous ranges and writes the working copy in the same pass. In a group's full layout every parameter starts 64-byte
// aligned (the gaps are zero and stay zero under every optimizer). How the
// layout is split across ranks depends on the ZeRO stage:
//  - replicated (stage 0): every rank holds the whole group;
//  - group-partitioned (stages 1-2): the full layout is cut into world_size
//    equal contiguous ranges of `stride` elements (parameters may straddle
//    ranks), as DeepSpeed stages 1-2 do;
//  - parameter-partitioned (stage 3): each parameter is cut into world_size
//    shards of its own `stride` (ceil(numel / world_size)); a rank's shards
//    sit back to back, aligned, in its flat buffers.
#pragma once

#include <zerod/zerod.h>

#include <cstdint>
#include <string>
#include <deque>
#include <functional>
#include <unordered_map>
#include <vector>

namespace zerod {

// A parameter's initial values, held from registration until finalize in
// the dtype they came in when that is 16-bit (they widen to fp32 exactly
// when written), else as fp32: a bf16 model holds 2 bytes a parameter here,
// not 4. Finalize drops them once the node's ranks have written them into
// their masters, before it allocates the gradients and optimizer state
// (Model::drop_initial_values): never held beside the whole state. Empty:
// zeros.
struct StagedValues {
  zd_dtype dtype = ZD_DTYPE_F32;
  std::vector<std::byte> bytes;

  bool empty() const { return bytes.empty(); }
  void clear() { std::vector<std::byte>().swap(bytes); }
  // numel elements of src (of src_dt), kept as described above.
  void assign(const void* src, zd_dtype src_dt, uint64_t numel);
  // Room for numel elements of dt (a receiver of rank 0's values).
  void resize(zd_dtype dt, uint64_t numel);
  // Elements [at, at + n) as fp32 into dst.
  void read_f32(uint64_t at, uint64_t n, float* dst) const;
};

struct ParamRecord {
  std::string name;
  zd_module_id module = 0;
  zd_dtype dtype = ZD_DTYPE_F32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int group = 0;               // index into Registry::groups()
  uint64_t full_offset = 0;    // element offset of the whole parameter in the group's full layout
  // Parameter-partitioned layouts only:
  uint64_t stride = 0;         // per-rank shard length (>= ceil(numel / world_size))
  uint64_t flat_offset = 0;    // offset of a rank's shard in its flat buffers
  bool persistent = false;     // stays gathered (small parameters)
  StagedValues staged_init;    // initial values held until finalize (empty = zeros)

  // Elements of the real parameter inside rank r's shard (the rest is padding).
  uint64_t shard_real(int rank) const;
};

struct ModuleRecord {
  std::string name;
  std::vector<zd_param_id> params;
};

struct ParamGroup {
  zd_dtype dtype = ZD_DTYPE_F32;  // working dtype
  int state_class = 0;            // LayoutPolicy::group_class
  std::vector<zd_param_id> params;
  uint64_t full_numel = 0;  // the full layout's length (aligned; padded to world * stride when group-partitioned)
  uint64_t stride = 0;      // elements each rank owns of the full layout (replicated: full_numel)
  uint64_t flat_numel = 0;  // parameter-partitioned: a rank's flat shard buffer length
};

enum class Partitioning { Replicated, Group, Param };

// How the layout is cut: the stage's partitioning, and the partitioner's
// shard length for a tensor of n elements at an alignment.
struct LayoutPolicy {
  Partitioning partitioning = Partitioning::Replicated;
  std::function<uint64_t(uint64_t numel, uint64_t align)> stride;
  uint64_t persistence_threshold = 0;  // parameter-partitioned: elements
  // Parameter-partitioned: each shard a multiple of this many elements (a
  // compressing optimizer asks 8, so that a rank's shard of a tensor is
  // the chunk of it the rank serves in a 1-bit exchange).
  uint64_t param_align = 1;
  // Parameters of one working dtype but another class (by index) go into
  // groups of their own: Placement::state_class, where a device the host
  // cannot address keeps some masters on the device and others off it.
  // Unset: one group per working dtype.
  std::function<int(size_t param)> group_class;
};

class Registry {
 public:
  explicit Registry(int world_size) : world_size_(world_size) {}

  // Throws with a message naming the parameter on a duplicate or bad input.
  zd_param_id add(const std::string& name, const std::string& module, zd_dtype dtype,
                  std::vector<int64_t> shape);

  // Assigns groups and offsets. Called once, at finalize.
  void lay_out(const LayoutPolicy& policy);
  Partitioning partitioning() const { return partitioning_; }

  int world_size() const { return world_size_; }
  const std::deque<ParamRecord>& params() const { return params_; }
  std::deque<ParamRecord>& params() { return params_; }
  const std::deque<ModuleRecord>& modules() const { return modules_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

  const ParamRecord& param(zd_param_id id) const;  // throws ZD_ERR_NOT_FOUND
  const ModuleRecord& module(zd_module_id id) const;
  zd_param_id find_param(const std::string& name) const;    // -1 if absent
  zd_module_id find_module(const std::string& name) const;  // -1 if absent
  uint64_t total_numel() const;

  // Elements per alignment unit of a flat buffer (64 bytes of the narrowest type).
  static constexpr uint64_t kAlignElems = 32;

 private:
  int world_size_;
  Partitioning partitioning_ = Partitioning::Replicated;
  std::deque<ParamRecord> params_;  // a deque: names stay put as params are added
  std::deque<ModuleRecord> modules_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<std::string, zd_param_id> param_by_name_;
  std::unordered_map<std::string, zd_module_id> module_by_name_;
};

}  // namespace zerod
