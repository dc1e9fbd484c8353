#include "join.h"

#include "mpi_env.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace zerod::comm::mpi {

namespace {

bool parse_int(const std::string& s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != 0 || v < 0 || v > 1 << 20) return false;
  *out = static_cast<int>(v);
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t end = s.find(sep); end != std::string::npos; at = end + 1, end = s.find(sep, at))
    parts.push_back(s.substr(at, end - at));
  parts.push_back(s.substr(at));
  return parts;
}

// Ends the process if the join has not finished by the deadline: nothing
// else can interrupt an MPI_Comm_accept or MPI_Comm_connect.
class Watchdog {
 public:
  Watchdog(const JoinRequest& r, std::atomic<int>* joined) {
    thread_ = std::thread([this, r, joined] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(r.timeout_s);
      while (!done_.load()) {
        if (std::chrono::steady_clock::now() >= deadline) {
          std::fprintf(stderr,
                       "zd_comm_mpi: ZEROD_MPI_JOIN: node %d waited %g s for the %d daemons of '%s' and saw %d; "
                       "is a node's daemon not started, or started with another ompi-server? Exiting.\n",
                       r.node, r.timeout_s, r.nodes, r.name.c_str(), joined->load());
          _exit(1);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  ~Watchdog() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

zd_status fail(int rc, const char* what, char* err, size_t err_size) {
  std::snprintf(err, err_size, "ZEROD_MPI_JOIN: %s failed: %s", what, error_text(rc).c_str());
  return ZD_ERR_PEER_LOST;
}

}  // namespace

bool join_requested(JoinRequest* out, zd_status* status, char* err, size_t err_size) {
  const char* v = std::getenv("ZEROD_MPI_JOIN");
  if (v == nullptr || *v == 0) return false;
  const std::vector<std::string> parts = split(v, ',');
  JoinRequest r;
  bool ok = (parts.size() == 3 || parts.size() == 4) && !parts[0].empty() && parse_int(parts[1], &r.node) &&
            parse_int(parts[2], &r.nodes) && r.nodes >= 1 && r.node < r.nodes;
  if (ok && parts.size() == 4) {
    char* end = nullptr;
    r.timeout_s = std::strtod(parts[3].c_str(), &end);
    ok = *end == 0 && r.timeout_s > 0;
  }
  if (!ok) {
    std::snprintf(err, err_size,
                  "ZEROD_MPI_JOIN='%s' is not <name>,<node>,<nodes>[,<timeout s>] with 0 <= node < nodes", v);
    *status = ZD_ERR_CONFIG;
    return true;
  }
  r.name = parts[0];
  *out = r;
  *status = ZD_OK;
  return true;
}

// The name daemon k looks up: node 0 publishes its port under one name per
// joining node, in turn, so that only one daemon connects at a time. (Open
// MPI 4.1 hung, about one join in five on a busy machine, when two daemons
// connected to the same port at once.)
static std::string turn_name(const JoinRequest& r, int node) { return r.name + "." + std::to_string(node); }

zd_status join_world(const JoinRequest& r, MPI_Comm* world, char* err, size_t err_size) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size != 1) {
    std::snprintf(err, err_size,
                  "ZEROD_MPI_JOIN is for daemons started one per mpirun, but this mpirun started %d processes; "
                  "daemons of one mpirun are one job already (unset ZEROD_MPI_JOIN)",
                  world_size);
    return ZD_ERR_CONFIG;
  }
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  std::atomic<int> joined{1};
  Watchdog watchdog(r, &joined);
  char port[MPI_MAX_PORT_NAME] = "";
  MPI_Comm group = MPI_COMM_SELF;
  // The communicators the join makes on the way (freed below).
  std::vector<MPI_Comm> steps;
  int rc;
  if (r.node == 0) {
    if ((rc = MPI_Open_port(MPI_INFO_NULL, port)) != MPI_SUCCESS) return fail(rc, "MPI_Open_port", err, err_size);
  } else {
    // Node 0 may not have published this node's turn yet: look again until
    // it has (the watchdog bounds the wait).
    const std::string mine = turn_name(r, r.node);
    while (MPI_Lookup_name(mine.c_str(), MPI_INFO_NULL, port) != MPI_SUCCESS)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    MPI_Comm inter = MPI_COMM_NULL;
    if ((rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter)) != MPI_SUCCESS)
      return fail(rc, "MPI_Comm_connect", err, err_size);
    steps.push_back(inter);
    if ((rc = MPI_Intercomm_merge(inter, 1, &group)) != MPI_SUCCESS)
      return fail(rc, "MPI_Intercomm_merge", err, err_size);
    steps.push_back(group);
  }
  // Whoever is in admits the next daemon, together, until all are; node 0
  // publishes whose turn it is.
  int size = 1;
  MPI_Comm_size(group, &size);
  joined.store(size);
  while (size < r.nodes) {
    const std::string next = turn_name(r, size);
    if (r.node == 0 && (rc = MPI_Publish_name(next.c_str(), MPI_INFO_NULL, port)) != MPI_SUCCESS) {
      std::snprintf(err, err_size,
                    "ZEROD_MPI_JOIN: publishing '%s' failed (%s): was mpirun given the job's ompi-server "
                    "(mpirun --ompi-server file:URI)?",
                    next.c_str(), error_text(rc).c_str());
      return ZD_ERR_CONFIG;
    }
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    if ((rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, group, &inter)) != MPI_SUCCESS)
      return fail(rc, "MPI_Comm_accept", err, err_size);
    steps.push_back(inter);
    if (r.node == 0) MPI_Unpublish_name(next.c_str(), MPI_INFO_NULL, port);
    if ((rc = MPI_Intercomm_merge(inter, 0, &merged)) != MPI_SUCCESS)
      return fail(rc, "MPI_Intercomm_merge", err, err_size);
    steps.push_back(merged);
    group = merged;
    MPI_Comm_size(group, &size);
    joined.store(size);
  }
  if (r.node == 0) MPI_Close_port(port);
  if (size != r.nodes) {
    std::snprintf(err, err_size, "ZEROD_MPI_JOIN: %d daemons joined '%s', which this node expected to have %d", size,
                  r.name.c_str(), r.nodes);
    return ZD_ERR_CONFIG;
  }
  // Ranks in node order, each node once.
  if ((rc = MPI_Comm_split(group, 0, r.node, world)) != MPI_SUCCESS) return fail(rc, "MPI_Comm_split", err, err_size);
  MPI_Comm_set_errhandler(*world, MPI_ERRORS_RETURN);
  // Open MPI's MPI_Finalize says goodbye on every communicator that still
  // spans jobs, and the join's steps differ between daemons (each made the
  // ones from its own arrival on): with them left in, one daemon waited on
  // a goodbye another never sent. Freed here, locally (MPI_Comm_disconnect
  // fences across the mpiruns, which hung), so that only the world spans
  // the daemons; the exit handler frees that (mpi_env.cpp).
  for (MPI_Comm& c : steps)
    if ((rc = MPI_Comm_free(&c)) != MPI_SUCCESS) return fail(rc, "MPI_Comm_free", err, err_size);
  std::vector<int> nodes(static_cast<size_t>(r.nodes));
  if ((rc = MPI_Allgather(&r.node, 1, MPI_INT, nodes.data(), 1, MPI_INT, *world)) != MPI_SUCCESS)
    return fail(rc, "MPI_Allgather", err, err_size);
  for (int i = 0; i < r.nodes; ++i)
    if (nodes[static_cast<size_t>(i)] != i) {
      std::snprintf(err, err_size,
                    "ZEROD_MPI_JOIN: the daemons of '%s' did not name nodes 0..%d once each (two said node %d)",
                    r.name.c_str(), r.nodes - 1, nodes[static_cast<size_t>(i)]);
      return ZD_ERR_CONFIG;
    }
  spanning_communicator(*world);
  return ZD_OK;
}

}  // namespace zerod::comm::mpi
