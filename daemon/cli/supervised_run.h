// `zerod run` for a job that takes snapshots during training
// (snapshot.every > 0): the daemon runs in a process of its own (`zerod
// serve`), which this supervisor restarts when it dies (a crash, SIGKILL,
// the OOM killer), with the ranks, which resume from the newest snapshot at
// finalize; with snapshot.resume = false, from the newest this run wrote
// (none: they start over), never from an earlier run's. Without snapshots,
// or with snapshots only at a clean end (every = 0), a restart would start
// the job from scratch, so plain `zerod run` keeps the daemon in its own
// process and restarts nothing.
#pragma once

#include "daemon_options.h"
#include "model/job_config.h"

#include <string>

namespace zerod::launch {
class Watchdog;
}

namespace zerod::cli {

// Runs the job with up to `restarts` restarts of a dead daemon; the exit
// status is as `zerod run`'s. `snapshot`: the job's (its path, and resume,
// which says what a restart may resume from). `watchdog` (may be null) is
// told of the ranks and of the socket's directory, so that they go if this
// process dies (launcher/watchdog.h); `run_id` names the ranks' files of
// this run there (ZEROD_RUN_ID), removed at the end and before each restart.
int run_supervised(const DaemonArgs& args, const SnapshotConfig& snapshot, int restarts, launch::Watchdog* watchdog,
                   const std::string& run_id);

}  // namespace zerod::cli
