// What the two files of Snapshots share and nothing else includes:
// snapshots.cpp writes and commits snapshots (and their verdict across
// nodes), snapshots_resume.cpp finds at finalize where the path is and
// which snapshot the job resumes from.
#pragma once

#include "manifest.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zerod::snapshot_detail {

// "step-000000000042": a whole snapshot's directory name (".partial" after
// it while it is written).
std::string step_dir(int64_t step);

// The steps of the whole snapshots under path, ascending: a directory with
// the manifest, or (a node's own part on a node-local disk) the part file.
std::vector<std::pair<int64_t, std::string>> whole_snapshots(const std::string& path, const std::string& part = "");

using ckpt::sync_dir;  // manifest.h

// Suffixes of a step directory's other names: an older copy being replaced
// by a new snapshot of the same step, and a snapshot of a timeline the job
// left (Snapshots::supersede).
inline constexpr const char* kOldSuffix = ".old";
inline constexpr const char* kSupersededSuffix = ".superseded";

// Renames the whole snapshot `from` to `to` (same directory), replacing a
// `to` that is there: the old one is renamed aside to `to`.old first, the
// new one in, and only then is the old one removed, so at every moment one
// of them is whole under a name start() knows (repair_replaced). Throws on
// a failed rename (the old one is back in place then).
void replace_dir(const std::string& from, const std::string& to);

// What a crash in replace_dir left under path: step-<N>.old goes back to
// step-<N> where that is missing (the crash came between the renames), and
// is removed where step-<N> is there (after them). Whether any was found.
bool repair_replaced(const std::string& path);

// This host's name, as gethostname says it ("?" where it does not).
std::string this_host();
// "pid 4242 on host a": this process, as a lock file names its holder.
std::string this_process();

// The snapshots' collectives: CommOp::Read in groups of their own (the
// whole-tensor reads of state_io use the low groups).
constexpr uint64_t kVerdict = 251, kResume = 252, kDiscover = 253, kLeave = 254;

}  // namespace zerod::snapshot_detail
