// When MPI is finalized, and why.
//
// Never before the process exits: MPI cannot be initialised a second time in
// a process, and a daemon may create another instance later (a job that
// restarts its ranks), so the last instance going away is not the end.
//
// At exit, when this plugin initialised MPI: an atexit handler calls
// MPI_Finalize, because mpirun reports a process that initialised MPI and
// exits without finalizing as an abnormal end and fails the whole job. The
// plugin is linked with -z nodelete, so a dlclose() never unmaps the
// handler (glibc would otherwise run it at dlclose, long before exit).
//
// Not when an instance is still alive: its network thread may be inside
// MPI. After a failed collective or create, requests may be left with a
// daemon that is gone or never came; Open MPI's MPI_Finalize does not wait for them (tested with a
// peer killed mid-collective), but a daemon that exits after a failure must
// not hang on that: a watchdog ends the process (status 1, with a message)
// if MPI_Finalize has not returned after 10 s.
//
// Daemons joined from mpiruns of their own (ZEROD_MPI_JOIN) are separate
// MPI jobs, and each job's MPI_Finalize synchronises only itself. Left to
// it, Open MPI says goodbye on every communicator that spans jobs, a
// message each way, and a daemon that got its goodbyes exits while another
// is still exchanging its own with it: in about one run in ten on a busy
// machine, the other's write was reset (or raised SIGPIPE) and it hung
// in MPI_Finalize. So the exit handler does it in an order that cannot
// race: a barrier on the joined world (every daemon is at its exit, no
// instance alive, nothing more will be sent), then it frees the world and
// every instance's duplicate, leaving Open MPI no goodbyes to say. A daemon
// whose ranks finish first waits at that barrier for the others, up to 50 s.
// After a failure (which the end of a job served on demand also is: ranks
// that leave abort their instances) it waits 10 s: all daemons at their
// exit meet and leave cleanly; with one gone, MPI_Finalize runs under the
// watchdog as above.
//
// When the host process initialised MPI itself, it finalizes it.
#include "mpi_env.h"

#include "join.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace zerod::comm::mpi {
namespace {

std::mutex g_init_mu;
bool g_initialised = false;  // guarded by g_init_mu
zd_status g_init_status = ZD_OK;
char g_init_error[512] = "";
Process g_process;

std::mutex g_call_mu;  // MPI_THREAD_SERIALIZED: one MPI call at a time
std::atomic<bool> g_serialized{false};

std::mutex g_kept_mu;
std::vector<std::shared_ptr<void>>* g_kept = nullptr;  // never freed: MPI may read it at exit

std::atomic<int> g_alive{0};
std::atomic<bool> g_failed{false};

std::atomic<bool> g_finalized{false};

std::mutex g_spanning_mu;
std::vector<MPI_Comm>* g_spanning = nullptr;  // never freed: read by the exit handler

// Ends the process if finalizing has not finished after `seconds`.
void finalize_watchdog(int seconds, const char* why) {
  std::thread([seconds, why] {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    if (g_finalized.load()) return;
    std::fprintf(stderr, "zd_comm_mpi: MPI_Finalize did not return within %d s %s; exiting without it\n", seconds,
                 why);
    _exit(1);
  }).detach();
}

// A barrier on `comm` that gives up after `seconds` (a peer may be gone);
// true when every member reached it.
bool barrier_within(MPI_Comm comm, int seconds) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &r) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int done = 0;
    if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;  // the request stays with MPI: it cannot be cancelled
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_alive.load() > 0) return;
  const bool joined = g_process.world != MPI_COMM_WORLD;
  // A failure here is often only the job's end: ranks that leave abort
  // their instance (to wake anyone still waiting for them), which counts as
  // a failure. Joined daemons still meet if they all can, briefly.
  const bool failed = g_failed.load();
  if (failed)
    finalize_watchdog(joined ? 20 : 10, "after a failed collective or create (another daemon may be gone)");
  else if (joined)
    finalize_watchdog(60, "waiting for the other joined daemons to end (is one of them stuck?)");
  if (joined) {
    std::lock_guard<std::mutex> lk(g_spanning_mu);
    if (g_spanning != nullptr && barrier_within(g_process.world, failed ? 10 : 50))
      for (auto c = g_spanning->rbegin(); c != g_spanning->rend(); ++c) MPI_Comm_free(&*c);
  }
  MPI_Finalize();
  g_finalized.store(true);
}

// The plugin is dlopen'ed RTLD_LOCAL, and so is the MPI library it links.
// Some MPI builds dlopen their own components, which look for the MPI
// library's symbols in the global scope: promote it there (it is already
// loaded; RTLD_NOLOAD only changes its scope).
void promote_mpi_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) != 0 && info.dli_fname != nullptr) {
    void* h = dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    (void)h;  // kept open on purpose: the library stays for the process
  }
}

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

zd_status first_init() {
  int already = 0;
  MPI_Initialized(&already);
  int level = MPI_THREAD_SINGLE;
  if (already) {
    MPI_Query_thread(&level);
  } else {
    promote_mpi_library();
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &level);
    if (rc != MPI_SUCCESS) {
      std::snprintf(g_init_error, sizeof g_init_error, "MPI_Init_thread failed: %s", error_text(rc).c_str());
      return ZD_ERR_CONFIG;
    }
    // Errors on MPI_COMM_WORLD (and on what is made from it before the
    // instance sets its own handler) come back as codes, not an abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit(finalize_at_exit);
  }
  if (level < MPI_THREAD_SERIALIZED) {
    std::snprintf(g_init_error, sizeof g_init_error,
                  "MPI provides %s, but the mpi comm plugin calls MPI from its own network threads and needs "
                  "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE%s",
                  level_name(level),
                  already ? " (MPI was initialised by the host process: ask for MPI_THREAD_MULTIPLE there)" : "");
    return ZD_ERR_CONFIG;
  }
  g_serialized.store(level < MPI_THREAD_MULTIPLE);
  g_process.thread_level = level;
  JoinRequest join;
  zd_status st = ZD_OK;
  if (join_requested(&join, &st, g_init_error, sizeof g_init_error)) {
    if (st != ZD_OK) return st;
    st = join_world(join, &g_process.world, g_init_error, sizeof g_init_error);
    if (st != ZD_OK) return st;
    g_process.node = join.node;
    g_process.nodes = join.nodes;
  } else {
    MPI_Comm_rank(MPI_COMM_WORLD, &g_process.node);
    MPI_Comm_size(MPI_COMM_WORLD, &g_process.nodes);
  }
  char name[MPI_MAX_PROCESSOR_NAME] = "";
  int len = 0;
  MPI_Get_processor_name(name, &len);
  g_process.host.assign(name, static_cast<size_t>(len > 0 ? len : 0));
  g_process.pid = static_cast<long>(getpid());
  return ZD_OK;
}

}  // namespace

zd_status init(Process* out, char* err, size_t err_size) noexcept {
  try {
    std::lock_guard<std::mutex> lk(g_init_mu);
    if (!g_initialised) {
      g_init_status = first_init();
      g_initialised = true;
    }
    if (g_init_status != ZD_OK) {
      if (err != nullptr && err_size > 0) std::snprintf(err, err_size, "%s", g_init_error);
      return g_init_status;
    }
    *out = g_process;
    return ZD_OK;
  } catch (...) {
    if (err != nullptr && err_size > 0) std::snprintf(err, err_size, "out of memory initialising MPI");
    return ZD_ERR_OUT_OF_MEMORY;
  }
}

Lock::Lock() : locked_(g_serialized.load(std::memory_order_relaxed)) {
  if (locked_) g_call_mu.lock();
}

Lock::~Lock() {
  if (locked_) g_call_mu.unlock();
}

void keep_until_exit(std::shared_ptr<void> memory) noexcept {
  try {
    std::lock_guard<std::mutex> lk(g_kept_mu);
    if (g_kept == nullptr) g_kept = new std::vector<std::shared_ptr<void>>;
    g_kept->push_back(std::move(memory));
  } catch (...) {
    // Out of memory: the memory goes with `memory` after all. MPI reads it
    // only if the peer that never received it comes back, which it does not.
  }
}

void spanning_communicator(MPI_Comm comm) noexcept {
  try {
    std::lock_guard<std::mutex> lk(g_spanning_mu);
    if (g_spanning == nullptr) g_spanning = new std::vector<MPI_Comm>;
    g_spanning->push_back(comm);
  } catch (...) {
    // Out of memory: MPI_Finalize says its goodbyes on it, as without a join.
  }
}

void instance_opened() noexcept { g_alive.fetch_add(1); }
void instance_closed() noexcept { g_alive.fetch_sub(1); }
void instance_failed() noexcept { g_failed.store(true); }

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof text, "MPI error %d", code);
    return text;
  }
  return std::string(text, static_cast<size_t>(len > 0 ? len : 0));
}

}  // namespace zerod::comm::mpi
