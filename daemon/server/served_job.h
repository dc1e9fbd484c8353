// One job's ranks on a daemon. A daemon of one job (`zerod run`, `zerod
// serve --job`) has exactly one. `zerod serve --jobs` keeps one per job key
// its ranks name in their hello (the launcher's ids, libzerod/src/launcher_env.h,
// or ZEROD_JOB_KEY), so that two jobs' rank 0s are two ranks, and forgets it
// once its ranks and models are gone.
#pragma once

#include "error.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace zerod::server {

class Session;

struct ServedJob {
  std::string key;    // "" for the one job of a single-job daemon
  std::string label;  // for messages: "job 2 (RANK=..., MASTER_PORT=...)"
  // Why ranks started again can never name this job again, so that a model
  // kept for their restart (daemon.keep_state) would only hold its memory;
  // "" when they can. Set by Server::join.
  std::string one_launch;
  int world_size = 1;
  int first_rank = 0;   // the ranks this daemon serves: [first_rank, first_rank + local_ranks)
  int local_ranks = 1;
  bool serves(int rank) const { return rank >= first_rank && rank < first_rank + local_ranks; }

  // Under Server::mu_.
  std::map<int, Session*> rank_owner;
  bool any_rank_came = false;
  int joining = 0;  // ranks between their hello's join() and claim_rank(): the job must stay
  // The launch its live ranks are of (Hello.launch_id; "" not known), so
  // that ranks of another launch running at once under the same key are
  // refused (Server::join). Taken by the next launch once none is live.
  std::string launch_id;
  // What follows up to `building` is the current run's: a run lasts while
  // some rank of the job holds a connection, and its record starts afresh
  // once none does (Server::release_rank), so that a daemon serving run
  // after run (`zerod serve --job`) pairs each run's creates among its own
  // ranks, whatever an earlier run left uneven.
  //
  // Per rank that joined: models it created so far in this run; its k-th
  // create is model key k-1, which every rank's k-th create shares. A map,
  // not a table of the claimed world size: a hello must not make the
  // daemon allocate what it merely claims.
  std::map<int, uint64_t> creates;
  // By model key: the error its create failed with, which the job's other
  // ranks then get at once (Server::create_or_attach says why).
  std::map<uint64_t, Error> failed_creates;
  // Ranks of this run whose connection ended and that no connection claimed
  // again within ServerOptions::reclaim_wait_ms, each with how it went
  // ("rank 1 (pid 7) is gone: ..."): the job's models it never attached to,
  // and those made after, count it lost (Server::lose_unless_reclaimed).
  std::map<int, std::string> departed;
  // Model keys a rank is building now, outside Server::mu_: the job's other
  // ranks asking for that model wait for it, and the job is not forgotten.
  std::set<uint64_t> building;
  // By job script text: a model that daemon.keep_state would have kept for
  // the restart of its lost ranks but did not (an optimizer step stopped
  // part-way in it: ModelHost::refused_restart), and those ranks not yet
  // told. Each one's next zd_model_create of that script fails with the
  // error, once; the job is not forgotten until all were told.
  struct RefusedRestart {
    Error error;
    std::set<int> ranks;
  };
  std::map<std::string, RefusedRestart> refused_restarts;

  // The job's models whose end was not saved: their final snapshot failed
  // (Model::final_snapshot), each with what the log said. A model ends on
  // whichever thread lets go of it last (a rank's session, Server::stop),
  // so this has a lock of its own, not Server::mu_; shared by the copies
  // Server::jobs() makes. `zerod run` and `zerod serve` read it once the
  // server has stopped, for their exit status.
  struct LostEnds {
    std::mutex mu;
    std::vector<std::string> what;
  };
  std::shared_ptr<LostEnds> lost_ends = std::make_shared<LostEnds>();
};

}  // namespace zerod::server
