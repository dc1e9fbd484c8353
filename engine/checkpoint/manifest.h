// The manifest of a checkpoint directory: what was saved (the parameters,
// the optimizer and its state slots, the step, the loss scaler) and how many
// shard files hold it. Written last, so a directory with a manifest is a
// whole checkpoint; a text file a person can read (docs/checkpoints.md has
// the format).
#pragma once

#include "file_access.h"

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

namespace zerod::ckpt {

// Format 2 adds where the parts of a snapshot across nodes live (`nodes`,
// `part`); format 3 the second shard set (`shard_set 1`); format 4 the
// optimizer's per-tensor scalars (`tensor_scalars`, `scalars`); format 5
// what each rank alone holds (`error_feedback`, `rank_copies`: records of
// shard_file.h's kRankBuffers); format 6 the learning rate the trainer set
// (`lr`, zd_model_set_lr). A manifest is written in the oldest format that
// holds it.
constexpr int kFormatVersion = 6;
constexpr const char* kManifestName = "zerod-checkpoint.txt";

struct ParamEntry {
  std::string name;
  std::string module;
  std::string dtype;  // the working copy's: "f32", "bf16", "f16"
  std::vector<int64_t> shape;
  uint64_t numel = 0;
};

// A node's part of a snapshot taken across nodes: its ranks' shards.
struct NodePart {
  int node = 0;
  std::string host;
  int first_rank = 0, ranks = 0;
};

struct Manifest {
  int version = kFormatVersion;
  int64_t step = 0;        // optimizer updates applied
  int world_size = 1;      // ranks that wrote shards
  int zero_stage = 0;
  std::string precision = "fp32";
  std::string optimizer;                 // plugin name
  std::vector<std::string> slots;        // its state slots, in order
  double loss_scale = 1.0;               // the loss scaler's state
  int64_t scaler_iteration = 0;
  int64_t scaler_last_overflow = -1;
  int scaler_hysteresis_left = 0;
  // Format 6: the lr zd_model_set_lr set, in force in place of the job's
  // schedule when the checkpoint was taken (the same on every rank); none:
  // the schedule's.
  std::optional<double> lr;
  std::vector<ParamEntry> params;        // registration order
  // The optimizer's per-tensor scalars (StateBuffers::tensor_scalars), the
  // same on every rank: tensor_scalars per parameter, in registration
  // order. 0 and none for an optimizer that keeps none, and in a manifest
  // written before format 4.
  uint32_t tensor_scalars = 0;
  std::vector<float> scalars;
  // Format 5: what each rank alone holds. error_feedback says, for a
  // compressing optimizer, whether each rank's shard holds the rank's error
  // feedback of its 1-bit exchanges (kWorkerError, kServerError*), which
  // belongs to world_size ranks: Yes where an exchange since its last
  // restart left it other than zero, No where no rank's is (one rank, or
  // none since the restart), Dropped where `zerod ckpt reshard` to another
  // world size left it out; Unknown in a manifest of another optimizer or
  // before format 5. error_fused: with Yes, per parameter group (the
  // working dtype's, in order of first registration; a layout split by
  // Placement::state_class is not recorded, so such a job does not take
  // the feedback up: rank_carry), whether its server
  // error is a fused group's chunk (1) or each tensor's (0). rank_copies:
  // Yes where, at ZeRO stage 0, each rank's shard but rank 0's holds the
  // rank's own master and state (kRankCopy), which 0/1 Adam's local steps
  // made its own (rank 0's are the plain records); Dropped as above.
  enum class Held : uint8_t { Unknown, No, Yes, Dropped };
  Held error_feedback = Held::Unknown;
  std::vector<char> error_fused;
  Held rank_copies = Held::No;
  // A snapshot across nodes: how many nodes wrote it, whether into one
  // directory every node sees (shared) or each into its own disk, and the
  // parts (every node's in the manifest; its own in a node's part file).
  int nodes = 0;  // 0: not a snapshot across nodes
  bool shared = true;
  std::vector<NodePart> parts;
  // Which names the shards have (shard_name): a save over a whole
  // checkpoint writes the set its manifest does not name, so the old one
  // stays whole until the new manifest replaces it.
  int shard_set = 0;
};

// The shard file of one rank: "rank-00001-of-00004.zdshard" in set 0,
// "rank-00001-of-00004-b.zdshard" in set 1.
std::string shard_name(int rank, int world_size, int shard_set = 0);
// The shard set a new checkpoint in `dir` writes: the one a whole
// checkpoint there does not use (0 where there is none, or its manifest
// cannot be read).
int shard_set_to_write(const std::string& dir);
// After `m` was written to `dir`: removes the shard files there that `m`
// does not name (an older checkpoint's, a failed save's). Best effort.
void remove_other_shards(const std::string& dir, const Manifest& m);
// Writes `text` to path + ".tmp", flushes it to disk and renames it to
// `path`: a reader sees the old file or the new one, whole.
void write_file_synced(const std::string& path, const std::string& text, FileAccess access = FileAccess::Umask);
// Makes the entries of `dir` (a rename into it) durable. Best effort.
void sync_dir(const std::string& dir);

void write_manifest(const std::string& dir, const Manifest& m, FileAccess access = FileAccess::Umask);
// The same text in a file of another name (a node's part file), flushed to disk.
void write_manifest_file(const std::string& path, const Manifest& m, FileAccess access = FileAccess::Umask);
// Reads `ndim` extents of a param line (a manifest's, an import
// description's) into p->shape: "" when each is positive and they multiply
// to p->numel, else what is wrong.
std::string read_extents(std::istream& line, size_t ndim, ParamEntry* p);
// The %XX escaping names use in manifests (and import descriptions).
std::string unescape_name(const std::string& s, const std::string& where);
// Throws ZD_ERR_IO naming the file when it is missing, and ZD_ERR_INVALID_ARGUMENT
// naming file:line for anything malformed or of a newer version.
Manifest read_manifest(const std::string& dir);
Manifest read_manifest_file(const std::string& path, const std::string& dir);

}  // namespace zerod::ckpt
