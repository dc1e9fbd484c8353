// One job's ranks on a daemon. A daemon of one job (`zerod run`, `zerod
// serve --job`) has exactly one. `zerod serve --jobs` keeps one per job key
// its ranks name in their hello (the launcher's ids, libzerod/src/launcher_env.h,
// or ZEROD_JOB_KEY), so that two jobs' rank 0s are two ranks, and forgets it
// once its ranks and models are gone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zerod::server {

class Session;

struct ServedJob {
  std::string key;    // "" for the one job of a single-job daemon
  std::string label;  // for messages: "job 2 (RANK=..., MASTER_PORT=...)"
  int world_size = 1;
  int first_rank = 0;   // the ranks this daemon serves: [first_rank, first_rank + local_ranks)
  int local_ranks = 1;
  bool serves(int rank) const { return rank >= first_rank && rank < first_rank + local_ranks; }

  // Under Server::mu_.
  std::map<int, Session*> rank_owner;
  bool any_rank_came = false;
  int joining = 0;  // ranks between their hello's join() and claim_rank(): the job must stay
  std::vector<uint64_t> creates;  // per local rank: models it created so far
};

}  // namespace zerod::server
