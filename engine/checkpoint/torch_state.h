// What zerod.torch's save_checkpoint keeps beside zerod's own state in a
// checkpoint directory: the tensors torch holds outside zerod (buffers,
// frozen parameters) in torch_state.safetensors, and the rest (client_state,
// a module's extra state, tensors of a dtype safetensors has no name for)
// pickled in torch_state.pt. Each is written under a staged name first
// (torch_state.next.*) and renamed once zerod's manifest is in place: the
// commit docs/checkpoints.md describes. `zerod ckpt export` writes the
// tensors with zerod's parameters; `reshard` carries both files along.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zerod::ckpt {

inline constexpr const char* kTorchStatePickle = "torch_state.pt";
inline constexpr const char* kTorchStatePickleStaged = "torch_state.next.pt";
inline constexpr const char* kTorchStateTensors = "torch_state.safetensors";
inline constexpr const char* kTorchStateTensorsStaged = "torch_state.next.safetensors";

// One tensor of torch_state.safetensors: its bytes are `bytes` from `offset`
// (absolute, in the file), in safetensors' dtype `dtype` ("F32", "I64", ...).
struct TorchTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct TorchTensors {
  std::string path;
  int64_t step = -1;  // the zerod step it was saved with (its metadata's zerod_step)
  std::vector<TorchTensor> tensors;
  // zerod's parameters that torch holds as 0-dim tensors (a CLIP logit
  // scale): zerod registers them as shape (1,), so the manifest says [1].
  std::vector<std::string> scalar_params;
  // Tensors torch holds outside zerod that only torch_state.pt holds (a
  // dtype safetensors has no name for).
  uint64_t pickled_only = 0;
};

// The bytes of one element of a safetensors dtype; 0 for a name it does not have.
size_t safetensors_dtype_size(const std::string& dtype);

// Reads and checks the header of a torch_state.safetensors: ZD_ERR_IO when
// it cannot be read, ZD_ERR_INVALID_ARGUMENT naming the file when it is not
// one (a tensor outside the file, a dtype and shape that do not fill its bytes).
TorchTensors read_torch_tensors(const std::string& path);

// The torch_state.safetensors in `dir` (committed or staged) saved with
// zerod's state of `step`; none where neither is of that step.
std::optional<TorchTensors> torch_tensors_of(const std::string& dir, int64_t step);

// How many tensor storages a torch.save file holds (its zip archive's
// data/N entries): what an export of a checkpoint whose torch_state.pt was
// written before torch_state.safetensors existed leaves out. Buffers,
// frozen parameters and any tensor of the client state alike; 0 where the
// file cannot be read as such an archive.
uint64_t pickled_tensor_count(const std::string& path);

// The files of `from_dir`'s torch state that belong to zerod's state of
// `step`, copied into `out_dir` under the staged names before a manifest of
// that step is written there (stage), then renamed into place once it is
// (commit), the order save_checkpoint keeps: a copy killed between leaves
// what load_checkpoint picks by the step. commit also removes the torch
// state files in out_dir that stage did not write (an earlier checkpoint's
// there, or all of them where from_dir has none).
struct StagedTorchState {
  bool pickle = false, tensors = false;
};
StagedTorchState stage_torch_state(const std::string& from_dir, int64_t step, const std::string& out_dir);
void commit_torch_state(const std::string& out_dir, const StagedTorchState& staged);

}  // namespace zerod::ckpt
