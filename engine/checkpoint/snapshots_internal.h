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

// The snapshots' collectives: CommOp::Read in groups of their own (the
// whole-tensor reads of state_io use the low groups).
constexpr uint64_t kVerdict = 251, kResume = 252, kDiscover = 253, kLeave = 254;

}  // namespace zerod::snapshot_detail
