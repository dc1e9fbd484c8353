// What `zerod ckpt` does with a checkpoint directory, as library calls (the
// command-line tool and the tests use them): check it, export it to
// safetensors, lay it out for another number of ranks.
#pragma once

#include "source.h"

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::ckpt {

// The checkpoint a command given `dir` reads. A folder that a trainer's
// save_checkpoint("ck") filled follows DeepSpeed's convention: tag
// directories (ck/global_step5/) and a file, ck/latest, naming the newest.
struct CheckpointDir {
  std::string path;         // the directory holding zerod-checkpoint.txt
  std::string tag;          // the tag taken ("" when dir is a checkpoint itself)
  bool from_latest = false; // the tag came from dir/latest
};

// `dir` itself when it holds a checkpoint; else the tag directory that
// dir/latest names; with `tag` (not empty), dir/<tag> whatever latest says.
// Throws ZD_ERR_IO when that directory holds no zerod checkpoint, saying why
// (no latest, a latest naming a missing tag, DeepSpeed's own files there:
// `zerod ckpt import` reads those).
CheckpointDir find_checkpoint(const std::string& dir, const std::string& tag = "");

// The tag dir/latest names (trimmed), or "" when dir has no latest file.
// Throws ZD_ERR_IO when it is there but names nothing.
std::string latest_tag(const std::string& dir);

// What `zerod ckpt info` says of the state a checkpoint holds beyond the
// parameters and their slots: the optimizer's per-tensor scalars and, from
// format 5, what each rank holds alone (a 1-bit exchange's error feedback,
// 0/1 Adam's per-rank copies after local steps), and that such state does
// not follow a load by another number of ranks. One line each, indented;
// "" where there is none.
std::string held_beyond_slots(const Manifest& m);

// Reads every record of every shard and checks its checksum; returns the
// number of records. Throws on the first damaged one, naming it.
uint64_t verify_all(const Source& src, unsigned threads);

struct ExportOptions {
  std::string out;                 // "model.safetensors" (a file; with shards, their common stem)
  std::string dtype = "fp32";      // "fp32", "bf16", "fp16"
  uint64_t max_shard_bytes = 0;    // 0: one file; else files of at most this much (a bigger tensor: a file alone)
  unsigned threads = 0;            // 0: the cores available
};

struct ExportResult {
  std::vector<std::string> written;  // the files, the index last
  // What an earlier export to the same output left that this one does not
  // write over: the other form's files (one file against shards and their
  // index) and shards of another count. A loader that found them beside
  // this export could read them instead (Hugging Face's loaders take
  // <stem>.safetensors before an index), so they are removed.
  std::vector<std::string> removed;
};

// Writes every parameter's full master value as a safetensors tensor named
// after the parameter, converted to the dtype, then the tensors torch held
// outside zerod (torch_state.safetensors of the checkpoint's step:
// torch_state.h) in their own dtypes; a 0-dim parameter it names gets shape
// []. Warns (log_warn) where such tensors are there only pickled. Memory
// stays within one chunk per thread. With shards:
// <stem>-00001-of-0000N.safetensors and <stem>.safetensors.index.json
// (Hugging Face's layout); over an earlier export whose index names shards
// of those names, the other set (<stem>-00001-of-0000N-b.safetensors), so
// the earlier one stays whole until the new index replaces it. An earlier export's
// files of those names that this one does not write are removed once it is
// whole (ExportResult::removed); where such a name holds a file that zerod's
// export did not write (its opening says whose it is), nothing is written
// and ZD_ERR_INVALID_ARGUMENT names it. So it does where a file this export
// writes (out itself, a shard, the index) is there and zerod's export did
// not write it, and where out is in the source checkpoint's own directory:
// an export replaces only an earlier export.
ExportResult export_safetensors(const Source& src, const ExportOptions& o);

// Writes the checkpoint again into out_dir as `world` shards, each parameter
// cut into `world` even runs: the layout a job of `world` ranks reads with
// one shard each, with zerod.torch's files of its step (torch_state.h).
// (Any checkpoint loads at any world size as it is; this spreads the
// files.) `world` from 1 to kMaxShards.
constexpr int kMaxShards = 99999;  // shard names number the ranks in five digits
void reshard(const Source& src, const std::string& out_dir, int world, unsigned threads);

// Writes a checkpoint into out_dir from a folder of raw fp32 files and their
// description (params.txt), as `python3 -m zerod.ckpt extract-deepspeed`
// writes them. Returns the manifest written.
Manifest import_raw(const std::string& raw_dir, const std::string& out_dir);

}  // namespace zerod::ckpt
