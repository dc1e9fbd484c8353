#include "snapshots.h"

#include "checkpoint_io.h"
#include "error.h"
#include "log.h"
#include "shard_file.h"
#include "snapshots_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

namespace zerod {

namespace fs = std::filesystem;

namespace snapshot_detail {

std::string step_dir(int64_t step) {
  char b[64];
  std::snprintf(b, sizeof b, "step-%012" PRId64, step);
  return b;
}

std::vector<std::pair<int64_t, std::string>> whole_snapshots(const std::string& path, const std::string& part) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = 0;
    char rest = 0;
    if (std::sscanf(name.c_str(), "step-%" SCNd64 "%c", &step, &rest) != 1) continue;  // .partial and others
    if (!fs::exists(e.path() / ckpt::kManifestName, ec) && (part.empty() || !fs::exists(e.path() / part, ec)))
      continue;
    out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void replace_dir(const std::string& from, const std::string& to) {
  const std::string old = to + kOldSuffix;
  std::error_code ec;
  fs::remove_all(old, ec);
  const bool had = fs::exists(to, ec);
  if (had) fs::rename(to, old);
  try {
    fs::rename(from, to);
  } catch (...) {
    if (had) fs::rename(old, to, ec);
    throw;
  }
  if (!had) return;
  // Both renames on disk before the old copy goes: a crash before this
  // leaves step-<N>.old, which repair_replaced puts back or removes.
  sync_dir(fs::path(to).parent_path().string());
  fs::remove_all(old, ec);
}

bool repair_replaced(const std::string& path) {
  std::error_code ec;
  std::vector<fs::path> olds;
  const std::string suffix = kOldSuffix;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      olds.push_back(e.path());
  }
  for (const fs::path& old : olds) {
    const fs::path whole = old.parent_path() / old.stem();
    if (fs::exists(whole, ec))
      fs::remove_all(old, ec);
    else
      fs::rename(old, whole, ec);
  }
  return !olds.empty();
}

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

std::string this_process() { return "pid " + std::to_string(::getpid()) + " on host " + this_host(); }

}  // namespace snapshot_detail

using namespace snapshot_detail;

namespace {

// The first line of a lock file: who holds it, as its holder wrote it.
std::string holder_in(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

// The processes that hold a lock on the file `fd` is open on, as
// /proc/locks lists them (by device and inode). Not known where the kernel
// does not list it: no /proc, a lock another host holds on a network file
// system.
struct LockHolders {
  bool known = false;
  bool exclusive = false;  // one of them holds it LOCK_EX
  std::vector<long> pids;
};

LockHolders lock_holders(int fd) {
  LockHolders h;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return h;
  char want[64];  // as the kernel writes it: "%02x:%02x:%lu"
  std::snprintf(want, sizeof want, "%02x:%02x:%lu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string id, kind, advisory, mode, device;
    long pid = 0;
    if (!(in >> id >> kind) || kind == "->") continue;  // one waiting for the lock, not holding it
    if (!(in >> advisory >> mode >> pid >> device) || device != want) continue;
    h.known = true;
    h.exclusive = h.exclusive || mode == "WRITE";
    h.pids.push_back(pid);
  }
  return h;
}

// Whether the process /proc/locks lists as `holder` is the one a lock file
// names as pid `named`: the same pid, or the one it has in a PID namespace
// below this one's (/proc/<pid>/status, NSpid), which is the pid a holder
// in a container wrote.
bool holder_is_named_pid(long holder, long named) {
  if (holder == named) return true;
  std::ifstream status("/proc/" + std::to_string(holder) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream pids(line.substr(6));
    for (long pid = 0; pids >> pid;)
      if (pid == named) return true;
    return false;
  }
  return false;
}

// Whether `named` (a lock file's first line, "pid N on host H (...)")
// names a process that does not hold the lock now: one of this host that
// is not among the holders the kernel lists. Its holder wrote it and exited
// without a word (a crash), and another process holds the file now. Where
// the kernel lists no holder the name is taken at its word, as one of
// another host is: /proc/locks leaves out the locks of processes that this
// /proc's PID namespace does not see (a daemon in another container), and
// kill() finds no such pid there either, though the process lives.
bool names_a_gone_holder(const std::string& named, const LockHolders& now) {
  long pid = 0;
  char host[256] = {};
  if (std::sscanf(named.c_str(), "pid %ld on host %255s", &pid, host) != 2) return false;
  if (this_host() != host || !now.known) return false;
  return std::none_of(now.pids.begin(), now.pids.end(), [pid](long holder) { return holder_is_named_pid(holder, pid); });
}

// ", uid U": whose process `pid` is, its effective uid (nothing where /proc
// does not say). From its status: /proc/<pid> itself belongs to root once a
// process changed its uid.
std::string uid_of_process(long pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    unsigned long real = 0, effective = 0;
    if (std::sscanf(line.c_str(), "Uid: %lu %lu", &real, &effective) == 2) return ", uid " + std::to_string(effective);
  }
  return "";
}

// A holder of `file` (open on `fd`) that did not name itself there, or
// whose name there is of a process gone (`stale`): who it is, as far as
// the kernel says; else whose the file is (where its mode is 0600, the
// owner's processes and root's are all that open it).
std::string unnamed_holder(int fd, const std::string& stale, const LockHolders& now) {
  std::string who;
  for (const long pid : now.pids) who += (who.empty() ? "pid " : "; pid ") + std::to_string(pid) + uid_of_process(pid);
  if (!who.empty()) {
    who += ", as /proc/locks lists it";
  } else {
    struct stat st {};
    if (::fstat(fd, &st) == 0) who = "the lock file belongs to uid " + std::to_string(st.st_uid);
  }
  long pid = 0;
  if (std::sscanf(stale.c_str(), "pid %ld", &pid) == 1)
    who += (who.empty() ? "the" : "; the") + std::string(" lock file still names pid ") + std::to_string(pid) +
           ", which no longer holds it";
  return "another process that did not name itself" + (who.empty() ? std::string() : " (" + who + ")");
}

// Why the lock file `file` cannot be opened (`err` the open's errno).
std::string why_no_lock_file(const std::string& file, int err) {
  struct stat st {};
  const bool there = ::lstat(file.c_str(), &st) == 0;
  if (err == ELOOP && there && S_ISLNK(st.st_mode))
    return file + " is a symbolic link, which zerod does not follow: one planted there would have this model "
                  "truncate and write the file it points to. Remove it (zerod makes the lock file itself)";
  std::string why = "cannot create " + file + ": " + errno_text(err);
  if (err == EACCES && there && st.st_uid != ::geteuid())
    why += " (it belongs to uid " + std::to_string(st.st_uid) + ", and this process runs as uid " +
           std::to_string(::geteuid()) + ")";
  return why;
}

}  // namespace

struct Snapshots::InFlight {
  int64_t step;
  std::string partial, final_dir;
  ckpt::Manifest manifest;
  int remaining;        // ranks still writing
  bool ok = true;
  int failed_rank = -1;
  std::string why;      // the first failure
  bool final = false;   // the end's (at_end, at_leave): its failure is lose_end's
  // Across nodes (under mu_): every local shard and the node's part file
  // are written; how many local ranks have the job's verdict.
  bool node_done = false;
  int agreed = 0;
};

Snapshots::Snapshots(const ModelContext& ctx, int first_local_rank, int local_ranks)
    : ctx_(ctx),
      first_local_(first_local_rank),
      local_ranks_(local_ranks),
      writers_(static_cast<size_t>(local_ranks)),
      reading_(static_cast<size_t>(local_ranks), 0),
      pending_(static_cast<size_t>(local_ranks)) {
  if (local_ranks > 0) {
    node_ = first_local_rank / local_ranks;
    nodes_ = (ctx.world_size + local_ranks - 1) / local_ranks;
  }
  if (!enabled()) return;
  std::error_code ec;
  ckpt::create_dirs(ctx.config.snapshot.path, ckpt::FileAccess::OwnerOnly, ec);
  if (ec)
    fail(ZD_ERR_IO, ctx.config.source + ": snapshot.path " + ctx.config.snapshot.path + " cannot be created: " +
                        ec.message());
  if (::access(ctx.config.snapshot.path.c_str(), W_OK) != 0)
    fail(ZD_ERR_IO, ctx.config.source + ": snapshot.path " + ctx.config.snapshot.path + " is not writable: " +
                        errno_text(errno));
  lock_path();
}

Snapshots::~Snapshots() {
  for (auto& t : writers_)
    if (t.joinable()) t.join();
  join_committer();
  // The last commit is done: the next model over the path may start.
  // Unlocked first: a process forked while the model lived (DataLoader
  // workers) shares the open file, and close() alone would leave the lock
  // held until the last such child is gone. The name goes first: left
  // there, a process that takes the file later without naming itself would
  // be taken for this one.
  for (const int fd : lock_fds_) {
    static_cast<void>(::ftruncate(fd, 0));  // best effort: the lock is let go of all the same
    ::flock(fd, LOCK_UN);
    ::close(fd);
  }
}

void Snapshots::lock_path() {
  const std::string& path = ctx_.config.snapshot.path;
  const std::string main_lock = path + "/.zerod.lock";
  char node_name[48];
  std::snprintf(node_name, sizeof node_name, "/.zerod-node-%05d.lock", node_);
  const std::string node_lock = path + node_name;
  const std::string me = this_process();
  const double wait_s = ctx_.config.comm_timeout_s;  // 0: as long as it takes
  char wait_text[32];
  std::snprintf(wait_text, sizeof wait_text, "%g s", wait_s);
  // Who holds `file` (open on `fd`, whose lock this model did not get), in words.
  const auto holder = [&](const std::string& file, int fd) {
    const LockHolders now = lock_holders(fd);
    std::string h = holder_in(file);
    if (h.empty() && file == main_lock && !(now.known && now.exclusive)) {
      // Held shared by the daemons of a job across nodes (each names itself
      // in its node's file).
      const std::string node0 = holder_in(path + "/.zerod-node-00000.lock");
      return "a job across nodes" + (node0.empty() ? std::string() : " (node 0: " + node0 + ")");
    }
    if (h.empty() || names_a_gone_holder(h, now)) return unnamed_holder(fd, h, now);
    if (h.rfind(me + " ", 0) == 0) h = "another model of the same process, " + h;
    if (!now.known) h += ", as the lock file says";  // the kernel named no holder to check it against
    return h;
  };
  // Takes the lock `how` on `file`, waiting for a holder that is ending
  // (a daemon exiting, a model whose last snapshot is being flushed).
  const auto take = [&](const std::string& file, int how) {
    // Never through a link: the file is truncated and written (its holder's name).
    const int fd = ckpt::open_to_write(file, O_RDWR | O_NOFOLLOW, ckpt::FileAccess::OwnerOnly);
    if (fd < 0) fail(ZD_ERR_IO, ctx_.config.source + ": snapshot.path " + path + ": " + why_no_lock_file(file, errno));
    lock_fds_.push_back(fd);
    const auto start = std::chrono::steady_clock::now();
    bool told = false;
    for (;;) {
      if (::flock(fd, how | LOCK_NB) == 0) break;
      const int err = errno;
      if (err == EINTR) continue;
      if (err != EWOULDBLOCK) {
        // A file system without locks (Lustre mounted without flock): the
        // snapshots work, unguarded.
        log_warn("snapshots: cannot lock " + file + " (" + errno_text(err) +
                 "): nothing keeps another model from writing its snapshots into " + path +
                 " at the same time; give each model its own snapshot.path");
        return false;
      }
      // What the daemon knows and the lock file does not: that it stops, or
      // that the holder is a model it keeps, which no wait ends.
      if (ctx_.config.snapshot.lock_wait_ends)
        if (const std::optional<Error> end = ctx_.config.snapshot.lock_wait_ends())
          fail(end->code(), ctx_.config.source + ": snapshot.path " + path + " is in use by " + holder(file, fd) +
                                ", which holds " + file + ": " + end->what());
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (wait_s > 0 && waited >= wait_s)
        fail(ZD_ERR_CONFIG, ctx_.config.source + ": snapshot.path " + path + " is in use by " + holder(file, fd) +
                                ", which holds " + file + ": two models writing snapshots into one path remove, "
                                "replace and prune each other's snapshots, and a restart resumes a mix of them; "
                                "give each model its own snapshot.path (waited " + wait_text +
                                ", comm.timeout, for it to let go)");
      if (!told) {
        told = true;
        const std::string how_long =
            wait_s > 0 ? "up to " + std::string(wait_text) + " (comm.timeout) for it to let go, then this model is "
                                                             "refused"
                       : std::string("for it to let go as long as it takes (comm.timeout = 0)");
        log_warn("snapshots: " + path + " is in use by " + holder(file, fd) + "; waiting " + how_long +
                 " (each model needs its own snapshot.path)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  };
  // The holder's name in the file it holds alone, for a refusal to give
  // (where it cannot be written, the lock holds all the same).
  const auto name_holder = [&](int fd, bool named) {
    const std::string line = named ? me + " (" + ctx_.config.source + ", ranks " + std::to_string(first_local_) +
                                         "-" + std::to_string(first_local_ + local_ranks_ - 1) + ")\n"
                                   : "";
    const bool written = ::ftruncate(fd, 0) == 0 &&
                         ::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
    static_cast<void>(written);
  };
  try {
    if (!across_nodes()) {
      if (take(main_lock, LOCK_EX)) name_holder(lock_fds_.back(), true);
      return;
    }
    // Shared by every daemon of the job (a one-daemon job over the path is
    // refused), and this node's own file exclusively (another job's daemon
    // of this node is refused there). The shared file names nobody: an
    // earlier one-daemon job's name in it would be taken for a holder now.
    if (take(main_lock, LOCK_SH)) name_holder(lock_fds_.back(), false);
    if (take(node_lock, LOCK_EX)) name_holder(lock_fds_.back(), true);
  } catch (...) {
    for (const int fd : lock_fds_) {  // the destructor does not run
      ::flock(fd, LOCK_UN);
      ::close(fd);
    }
    lock_fds_.clear();
    throw;
  }
}

double Snapshots::all_reduce_max(int rank, RankResources& res, uint64_t group, uint64_t id, const std::string& what,
                                 double value) const {
  return zerod::all_reduce_max(ctx_, res, rank, group, id, what, value);
}

std::string Snapshots::node_of(int rank) const {
  const int node = rank / std::max(1, local_ranks_);
  std::string s = "node " + std::to_string(node);
  if (static_cast<size_t>(node) < hosts_.size()) s += " (host " + hosts_[static_cast<size_t>(node)] + ")";
  return s;
}

std::string Snapshots::part_name() const {
  char b[32];
  std::snprintf(b, sizeof b, "node-%05d.part", node_);
  return b;
}

ckpt::Manifest Snapshots::with_parts(ckpt::Manifest m, bool all) const {
  if (!across_nodes()) return m;
  m.nodes = nodes_;
  m.shared = shared_.load();
  m.parts.clear();
  for (int n = 0; n < nodes_; ++n)
    if (all || n == node_)
      m.parts.push_back({n, static_cast<size_t>(n) < hosts_.size() ? hosts_[static_cast<size_t>(n)] : "?",
                         n * local_ranks_, local_ranks_});
  return m;
}

// ---------------------------------------------------------------------------
// Writing

void Snapshots::begin(int64_t step, const ckpt::Manifest& manifest) {
  // The first rank to arrive makes the snapshot; the others join it.
  if (current_ && current_->step == step && current_->remaining > 0) return;
  auto s = std::make_shared<InFlight>();
  s->step = step;
  s->final_dir = ctx_.config.snapshot.path + "/" + step_dir(step);
  s->partial = s->final_dir + ".partial";
  s->manifest = manifest;
  s->remaining = local_ranks_;
  std::error_code ec;
  // A leftover of a crash; in one directory of several nodes that was
  // cleared at start (another node may be writing into it now).
  if (!across_nodes() || !shared_.load()) fs::remove_all(s->partial, ec);
  ckpt::create_dirs(s->partial, ckpt::FileAccess::OwnerOnly, ec);
  if (ec) {
    s->ok = false;
    s->failed_rank = first_local_;
    s->why = "cannot create " + s->partial + ": " + ec.message();
  }
  current_ = s;
}

void Snapshots::after_step(int rank, int64_t step, RankResources& res, StateBuffers& buffers,
                           MomentumCompression& compression, const LossScaler& scaler,
                           std::optional<double> trainer_lr) {
  if (!enabled()) return;
  // A snapshot due now first waits for the one before to be whole.
  if (across_nodes()) settle(rank, res, /*wait=*/due(step));
  if (!due(step)) return;
  join_writer(rank);
  const std::shared_ptr<InFlight> s = begin_reading(rank, step, scaler, trainer_lr, buffers, compression);
  const auto local = static_cast<size_t>(rank - first_local_);
  if (across_nodes()) pending_[local] = s;
  try {
    writers_[local] =
        std::thread([this, s, rank, &res, &buffers, &compression] { write_shard(s, rank, res, buffers, compression); });
  } catch (const std::system_error&) {  // no thread: written here, as at the end
    write_shard(s, rank, res, buffers, compression);
  }
}

void Snapshots::fence(int rank) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !reading_[static_cast<size_t>(rank - first_local_)]; });
}

void Snapshots::join_writer(int rank) {
  std::thread& t = writers_[static_cast<size_t>(rank - first_local_)];
  if (t.joinable()) t.join();
}

void Snapshots::write_shard(const std::shared_ptr<InFlight>& s, int rank, RankResources& res, StateBuffers& buffers,
                            MomentumCompression& compression) {
  bool ok = s->ok;
  std::string why;
  // The rank's buffers are free again: its next update may change them.
  const auto done_reading = [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_[static_cast<size_t>(rank - first_local_)] = 0;
    }
    cv_.notify_all();
  };
  if (ok) {
    try {
      // At stage 0 one copy is all of it: rank 0's, or each node's first
      // rank's where every node keeps its own part.
      const bool replicated_writer = rank == 0 || (across_nodes() && !shared_.load() && rank == first_local_);
      ckpt::ShardWriter out(s->partial + "/" + ckpt::shard_name(rank, ctx_.world_size), rank, ctx_.world_size,
                           ckpt::FileAccess::OwnerOnly);
      write_rank_shard(ctx_, res, buffers, compression, out, replicated_writer);
      out.write_index();
      done_reading();
      out.sync();  // off the training's path: only the commit waits for it
    } catch (const std::exception& e) {
      ok = false;
      why = "rank " + std::to_string(rank) + ": " + e.what();
    }
  }
  done_reading();
  finish_shard(s, ok, rank, why);
}

void Snapshots::finish_shard(const std::shared_ptr<InFlight>& s, bool ok, int rank, const std::string& why) {
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok && s->ok) {
      s->ok = false;
      s->failed_rank = rank;
      s->why = why;
    }
    last = --s->remaining == 0;
  }
  if (!last) return;
  if (!across_nodes()) {
    commit(*s);
    return;
  }
  // This node's part is on disk: its part file says so (the report the
  // verdict at the next step collects).
  std::string part_why;
  if (s->ok) {
    try {
      sync_dir(s->partial);
      ckpt::write_manifest_file(s->partial + "/" + part_name(), s->manifest, ckpt::FileAccess::OwnerOnly);
      sync_dir(s->partial);
    } catch (const std::exception& e) {
      part_why = e.what();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!part_why.empty() && s->ok) {
      s->ok = false;
      s->failed_rank = first_local_;
      s->why = part_why;
    }
    s->node_done = true;
  }
  cv_.notify_all();
}

void Snapshots::commit(InFlight& s) {
  std::error_code ec;
  if (s.ok) {
    try {
      ckpt::write_manifest(s.partial, s.manifest, ckpt::FileAccess::OwnerOnly);
      sync_dir(s.partial);
      supersede(s.step);
      replace_dir(s.partial, s.final_dir);
      sync_dir(ctx_.config.snapshot.path);
      last_step_.store(s.step);
      log_info("snapshot of step " + std::to_string(s.step) + " written: " + s.final_dir);
      prune();
      return;
    } catch (const std::exception& e) {
      s.why = e.what();
    }
  }
  fs::remove_all(s.partial, ec);
  report_lost(s, "failed (" + s.why + ") and was removed");
}

void Snapshots::report_lost(const InFlight& s, const std::string& how) {
  if (s.final) {
    lose_end(s.step, "the final snapshot, of step " + std::to_string(s.step) + ", " + how);
    return;
  }
  log_message(ZD_LOG_ERROR, "the snapshot of step " + std::to_string(s.step) + " " + how +
                                "; training goes on, and the older snapshots under " + ctx_.config.snapshot.path +
                                " are kept");
}

void Snapshots::lose_end(int64_t step, const std::string& failure) {
  // The end: training does not go on, and nothing after this saves the run.
  // Said as it is, with what a new run would resume and what to do (before,
  // the periodic snapshot's "training goes on" was said here too, and a job
  // of snapshot.every = 0 lost the whole run without a word of it).
  const std::string& path = ctx_.config.snapshot.path;
  const auto kept = candidates();
  std::string m = failure + ": the run's final state (step " + std::to_string(step) + ") was NOT saved; ";
  if (!kept.empty())
    m += "the newest snapshot kept is of step " + std::to_string(kept.back().first) + " (" + kept.back().second +
         "), which a new run of the job over the path resumes" +
         (ctx_.config.snapshot.resume ? "" : " with snapshot.resume = true");
  else
    m += "no snapshot is kept under " + path + ": nothing of this run is saved there";
  if (ctx_.config.snapshot.every == 0)
    m += " (snapshot.every = 0 snapshots only the end; snapshot.every = N keeps one every N steps)";
  m += ". Free space on the disk of " + path + " (or give snapshot.path one with room) before the next run; a run "
       "whose end must not depend on this snapshot saves a checkpoint (zd_model_save, which returns its error) "
       "before zd_model_destroy";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!final_failure_.empty()) {
      // Another local rank's word on the same end (at_leave): the first said it all.
      log_warn(failure);
      return;
    }
    final_failure_ = m;
  }
  log_message(ZD_LOG_ERROR, m);
}

std::string Snapshots::final_failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return final_failure_;
}

namespace {

// The superseded snapshots under path (Snapshots::supersede), ascending.
std::vector<std::pair<int64_t, fs::path>> superseded_snapshots(const std::string& path) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = 0;
    char rest[16] = {};
    if (std::sscanf(name.c_str(), "step-%" SCNd64 "%15s", &step, rest) == 2 &&
        std::strcmp(rest, kSupersededSuffix) == 0)
      out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

void Snapshots::supersede(int64_t step) {
  // Later steps than the one committed now are a timeline this job left: it
  // went back to an earlier state (zd_model_load, zd_model_set_step, a
  // start over with snapshot.resume = false, an older snapshot resumed
  // because the newer one was damaged or not on every node). A resume takes
  // the newest step there is, so left there they would be resumed instead
  // of this job's. Moved aside before this snapshot is renamed in: a crash
  // between the two resumes this job's newest before it, never them.
  const std::string& path = ctx_.config.snapshot.path;
  std::vector<std::string> later;
  for (const auto& [s, dir] : candidates())
    if (s > step) later.push_back(dir);
  if (later.empty()) return;
  std::error_code ec;
  // Those of a timeline left before go: only the one left last is kept.
  for (const auto& [s, dir] : superseded_snapshots(path)) fs::remove_all(dir, ec);
  std::string moved;
  for (const std::string& dir : later) {
    const std::string aside = dir + kSupersededSuffix;
    fs::rename(dir, aside, ec);
    if (ec) {
      fs::remove_all(dir, ec);  // never resumed, either way
      moved += "\n  " + dir + " (removed: it could not be renamed)";
    } else {
      moved += "\n  " + aside;
    }
  }
  sync_dir(path);
  log_warn("snapshots: the job writes the snapshot of step " + std::to_string(step) + " where " + path +
           " holds snapshots of later steps, of a run this job went back from (a load or zd_model_set_step of an "
           "earlier step, a start over, an older snapshot resumed): they are moved aside, never to be resumed; "
           "the newest " + std::to_string(ctx_.config.snapshot.keep) + " of them stay (snapshot.keep) until the "
           "job goes back again:" + moved);
}

void Snapshots::prune() {
  const auto keep = static_cast<size_t>(ctx_.config.snapshot.keep);
  std::error_code ec;
  const auto ours = candidates();  // supersede() left none after the one just written
  for (size_t i = 0; i + keep < ours.size(); ++i) fs::remove_all(ours[i].second, ec);
  const auto aside = superseded_snapshots(ctx_.config.snapshot.path);
  for (size_t i = 0; i + keep < aside.size(); ++i) fs::remove_all(aside[i].second, ec);
}

// ---------------------------------------------------------------------------
// Across nodes: the verdict and the commit

void Snapshots::settle(int rank, RankResources& res, bool wait) {
  std::shared_ptr<InFlight>& slot = pending_[static_cast<size_t>(rank - first_local_)];
  if (!slot) return;
  const std::shared_ptr<InFlight> s = slot;
  // This rank's say: 0 its node's part is whole, 1 not yet, 2 + (W - r) rank
  // r failed. The largest over the job is everyone's answer.
  const int world = ctx_.world_size;
  double say = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait) cv_.wait(lock, [&] { return s->node_done; });
    say = !s->node_done ? 1.0 : s->ok ? 0.0 : 2.0 + static_cast<double>(world - s->failed_rank);
  }
  const std::string what = "snapshot of step " + std::to_string(s->step) + ": is every node's part written";
  const double v = all_reduce_max(rank, res, kVerdict, static_cast<uint64_t>(s->step), what, say);
  if (v == 1.0) return;  // not yet everywhere: asked again at the next step
  slot.reset();
  const int job_failed = v == 0 ? -1 : world - static_cast<int>(v - 2.0);
  if (job_failed < 0) last_step_.store(s->step);
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = ++s->agreed == local_ranks_;
  }
  if (last) conclude(s, job_failed);
}

void Snapshots::join_committer() {
  std::lock_guard<std::mutex> lock(commit_mu_);
  if (committer_.joinable()) committer_.join();
}

// Once per node, by its last rank to learn the verdict.
void Snapshots::conclude(const std::shared_ptr<InFlight>& s, int failed_rank) {
  std::lock_guard<std::mutex> lock(commit_mu_);
  if (committer_.joinable()) committer_.join();  // the previous commit first
  if (failed_rank < 0) {
    committer_ = std::thread([this, s] { commit_across(*s); });
    return;
  }
  // One node's part is not whole: nobody commits; the one who would have
  // renamed the directory removes it.
  if (!shared_.load() || node_ == 0) {
    std::error_code ec;
    fs::remove_all(s->partial, ec);
  }
  const bool here = failed_rank >= first_local_ && failed_rank < first_local_ + local_ranks_;
  const std::string why = here ? s->why : "rank " + std::to_string(failed_rank) + ": that node's log says why";
  report_lost(*s, "failed on " + node_of(failed_rank) + " (" + why + ") and was removed");
}

void Snapshots::commit_across(InFlight& s) {
  const bool shared = shared_.load();
  if (shared && node_ != 0) return;  // node 0 commits the one directory
  std::error_code ec;
  try {
    if (node_ == 0) {
      if (shared)
        for (int n = 0; n < nodes_; ++n) {
          char part[32];
          std::snprintf(part, sizeof part, "node-%05d.part", n);
          if (::access((s.partial + "/" + part).c_str(), F_OK) != 0)
            fail(ZD_ERR_IO, "node " + std::to_string(n) + " reported its part written, but " + s.partial + "/" +
                                part + " is not there");
        }
      // Written last, after every node reported: the snapshot is whole.
      ckpt::write_manifest(s.partial, with_parts(s.manifest, true), ckpt::FileAccess::OwnerOnly);
    }
    sync_dir(s.partial);
    supersede(s.step);
    replace_dir(s.partial, s.final_dir);
    sync_dir(ctx_.config.snapshot.path);
    const char* what = shared ? " (every node's part)"
                       : node_ == 0 ? " (this node's part and the manifest)"
                                    : " (this node's part)";
    log_info("snapshot of step " + std::to_string(s.step) + " written: " + s.final_dir + what);
    prune();
  } catch (const std::exception& e) {
    fs::remove_all(s.partial, ec);
    // Only this node knows (its daemon, node 0 of one shared directory,
    // commits alone after every node agreed).
    report_lost(s, "could not be committed (" + std::string(e.what()) + ") and was removed");
  }
}

// ---------------------------------------------------------------------------
// The end

std::shared_ptr<Snapshots::InFlight> Snapshots::begin_reading(int rank, int64_t step, const LossScaler& scaler,
                                                               std::optional<double> trainer_lr,
                                                               const StateBuffers& buffers,
                                                               const MomentumCompression& compression, bool final) {
  std::lock_guard<std::mutex> lock(mu_);
  begin(step, with_parts(describe_model(ctx_, step, scaler, trainer_lr, buffers, compression), false));
  reading_[static_cast<size_t>(rank - first_local_)] = 1;
  if (final) current_->final = true;
  return current_;
}

void Snapshots::at_end(int64_t step, const std::vector<RankView>& ranks, const LossScaler& scaler,
                       std::optional<double> trainer_lr) {
  if (!enabled() || across_nodes()) return;  // across nodes: at_leave
  // The last snapshot's writers are done, their commit too (the last one's).
  for (int r = first_local_; r < first_local_ + local_ranks_; ++r) join_writer(r);
  if (last_step_.load() == step || step == 0 || ranks.empty()) return;
  std::shared_ptr<InFlight> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    begin(step,
          describe_model(ctx_, step, scaler, trainer_lr, *ranks.front().buffers, *ranks.front().compression));
    s = current_;
    s->final = true;
    for (const RankView& v : ranks) reading_[static_cast<size_t>(v.res->rank - first_local_)] = 1;
  }
  for (const RankView& v : ranks) write_shard(s, v.res->rank, *v.res, *v.buffers, *v.compression);
}

void Snapshots::at_leave(int rank, int64_t step, bool clean, RankResources& res, StateBuffers& buffers,
                         MomentumCompression& compression, const LossScaler& scaler,
                         std::optional<double> trainer_lr) {
  if (!enabled() || !across_nodes()) return;
  settle(rank, res, /*wait=*/true);  // the snapshot written last, if not agreed yet
  const double unclean = all_reduce_max(rank, res, kLeave, 0, "the end: does every rank leave between steps",
                                        clean ? 0.0 : 1.0);
  if (unclean != 0 || step == 0 || last_step_.load() == step) return;
  join_writer(rank);
  const std::shared_ptr<InFlight> s =
      begin_reading(rank, step, scaler, trainer_lr, buffers, compression, /*final=*/true);
  pending_[static_cast<size_t>(rank - first_local_)] = s;
  write_shard(s, rank, res, buffers, compression);
  settle(rank, res, /*wait=*/true);
  join_committer();  // on disk before the rank is told it left
}

}  // namespace zerod

