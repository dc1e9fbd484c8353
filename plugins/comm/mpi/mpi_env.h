// MPI for the whole process, which the mpi plugin owns: it initialises MPI
// once (or uses the MPI the host process already initialised), serialises
// calls when the library is not fully thread-safe, and decides whether to
// finalize at exit (mpi_env.cpp says why it never does before).
#ifndef ZEROD_COMM_MPI_MPI_ENV_H
#define ZEROD_COMM_MPI_MPI_ENV_H

#include <zerod/zerod_plugin.h>

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

namespace zerod::comm::mpi {

// This process in the daemons' world: one daemon (node) of the job. The
// world is MPI_COMM_WORLD, or, with ZEROD_MPI_JOIN, the daemons that each
// came from an mpirun of their own (join.h).
struct Process {
  MPI_Comm world = MPI_COMM_WORLD;
  int node = 0;
  int nodes = 1;
  int thread_level = MPI_THREAD_SINGLE;  // what the library provides
  std::string host;                      // MPI_Get_processor_name
  long pid = 0;
};

// Initialises MPI the first time (MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE), then returns the same answer. Refuses (ZD_ERR_CONFIG)
// an MPI that gives less than MPI_THREAD_SERIALIZED: the plugin calls MPI
// from its own network threads. Thread-safe.
zd_status init(Process* out, char* err, size_t err_size) noexcept;

// Held around every MPI call: a process-wide mutex under
// MPI_THREAD_SERIALIZED, nothing under MPI_THREAD_MULTIPLE.
class Lock {
 public:
  Lock();
  ~Lock();
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  bool locked_;
};

// Instances tell the exit handler whether finalizing is safe: none alive
// (no thread in MPI) and none ever failed (no request left with a peer
// that may be gone). A create that failed counts as failed: it may have
// left its communicator's duplicate or gather posted with a daemon that
// never came.
void instance_opened() noexcept;
void instance_closed() noexcept;
void instance_failed() noexcept;

// A communicator that spans daemons of mpiruns of their own (ZEROD_MPI_JOIN):
// the joined world and every instance's duplicate of it. The exit handler
// frees them after a barrier (mpi_env.cpp says why).
void spanning_communicator(MPI_Comm comm) noexcept;

// Memory MPI may still read (the buffer of a send posted to a daemon that
// never received it): kept, reachable, until the process exits.
void keep_until_exit(std::shared_ptr<void> memory) noexcept;

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
std::string error_text(int code);

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_MPI_ENV_H
