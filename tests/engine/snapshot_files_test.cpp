// Who may read, and lock, what a snapshot path holds. The weights and
// optimizer state there were readable by every local user, and any of them
// could hold the path's lock (flock needs only a read handle), so that the
// job was refused naming a daemon that had exited long before. Now what
// zerod makes under the path is its owner's alone (folders 0700, files
// 0600), the lock file is never opened through a symbolic link, and a
// holder that did not name itself is not taken for the process whose name
// a crash left in the file, nor one in another PID namespace (a container)
// called gone. A checkpoint the user saves follows the umask.
// The tests of another uid need root (fork, then setuid in the child), as
// transport.PeerUid.* do.
#include "zero_fixture.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace zerod_test;
namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;

struct TempDir {
  TempDir() {
    char t[] = "/var/tmp/zerod-snapfiles-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

// The process's umask for a scope.
struct UmaskFor {
  explicit UmaskFor(mode_t mask) : before(::umask(mask)) {}
  ~UmaskFor() { ::umask(before); }
  mode_t before;
};

mode_t mode_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 07777;  // no mode a test expects
  return st.st_mode & 07777;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A one-rank job of one small parameter that snapshots into `path` every 2 steps.
JobOptions snapshot_job(const std::string& path) {
  JobOptions o;
  o.snapshot.path = path;
  o.snapshot.every = 2;
  return o;
}

// Registers the model's parameter on its one rank and trains `steps` steps.
void train(Model& m, int steps) {
  const std::vector<zd_param_id> ids = register_sine_modules(m, 0, {64}, ZD_DTYPE_F32);
  for (int s = 0; s < steps; ++s) {
    m.backward_begin(0, 0);
    const ViewInfo g = m.grad_view(0, ids[0]);
    auto* grad = static_cast<float*>(g.data);
    for (size_t j = 0; j < g.bytes / 4; ++j) grad[j] = 0.01f * static_cast<float>(j + static_cast<size_t>(s));
    m.backward_end(0, 0);
    m.step(0);
  }
}

// The error a model over the path is refused with ("" where it was made).
std::string refusal(const JobOptions& o) {
  ::testing::internal::CaptureStderr();
  std::string what;
  try {
    make_model(o, 1);
  } catch (const Error& e) {
    what = e.what();
  }
  ::testing::internal::GetCapturedStderr();
  return what;
}

// Drops the forked child to uid and gid 65534 with no other group, as
// `setpriv --reuid 65534 --regid 65534 --clear-groups` does; exits 250 where
// it cannot.
void become_nobody() {
  if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(250);
}

int exit_status(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// What a process of uid 65534 gets when it opens `path` to read: 0 it
// could, else the open's errno.
int open_as_nobody(const std::string& path) {
  const pid_t child = ::fork();
  if (child != 0) return exit_status(child);
  become_nobody();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::_exit(fd >= 0 ? 0 : errno);
}

// What a child exits with where this process may not make a PID namespace
// (it needs root, or unprivileged user namespaces).
constexpr int kNoNamespace = 77;

bool write_text(const char* file, const std::string& text) {
  const int fd = ::open(file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return written;
}

// In a forked child: makes a new PID namespace, as a container's, and
// returns in its first process (pid 1 there), the child waiting for it and
// exiting with its status. Not root, it makes a user namespace too, where
// its uid is root. With `own_proc`, that process mounts a /proc of the new
// namespace (in a mount namespace of its own), which lists none of the
// processes outside, as a container's /proc. Exits kNoNamespace where it
// may not.
void enter_a_new_pid_namespace(bool own_proc) {
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  int flags = CLONE_NEWPID | (own_proc ? CLONE_NEWNS : 0);
  if (uid != 0) flags |= CLONE_NEWUSER;
  if (::unshare(flags) != 0) ::_exit(kNoNamespace);
  if (uid != 0 && !(write_text("/proc/self/setgroups", "deny") &&
                    write_text("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") &&
                    write_text("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")))
    ::_exit(kNoNamespace);
  const pid_t first = ::fork();
  if (first < 0) ::_exit(kNoNamespace);
  if (first > 0) ::_exit(exit_status(first));
  if (own_proc && (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
                   ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0))
    ::_exit(kNoNamespace);
}

// A forked child runs `take` (which takes the path's lock, and returns
// false where it could not) and keeps what it took while this process
// makes a model over the path (timeout 0.2 s): the child's pid, whether it
// took it, the model's refusal meanwhile ("" where it did not), and the
// child's exit status.
struct HeldElsewhere {
  pid_t pid = -1;
  bool held = false;
  std::string refusal;
  int status = -1;
};
HeldElsewhere refusal_while_a_child_holds(const std::string& path, const std::function<bool()>& take) {
  int ready[2], hold[2];
  if (::pipe(ready) != 0 || ::pipe(hold) != 0) return {};
  const pid_t child = ::fork();
  if (child < 0) return {};
  if (child == 0) {
    ::close(ready[0]);
    ::close(hold[1]);
    if (!take()) ::_exit(1);
    char c = 1;
    static_cast<void>(::write(ready[1], &c, 1));
    static_cast<void>(::read(hold[0], &c, 1));  // held until the parent closes its end
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(hold[0]);
  HeldElsewhere r;
  r.pid = child;
  char c = 0;
  r.held = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  JobOptions o = snapshot_job(path);
  o.timeout_s = 0.2;
  if (r.held) r.refusal = refusal(o);
  ::close(hold[1]);
  r.status = exit_status(child);
  return r;
}

// Locks `file` exclusively and names the holder in its first line, as a
// model does ("pid N on host H (job, ranks 0-0)"). Returns the open file,
// which holds the lock until it is closed; -1 where it could not.
int hold_named(const std::string& file, const std::string& job) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return -1;
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  const std::string name = "pid " + std::to_string(::getpid()) + " on host " + host + " (" + job + ", ranks 0-0)\n";
  if (::flock(fd, LOCK_EX) != 0 || ::ftruncate(fd, 0) != 0 ||
      ::write(fd, name.data(), name.size()) != static_cast<ssize_t>(name.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A snapshot path zerod made and a model wrote a snapshot into, under a
// umask that keeps nothing from anyone: the path and the snapshot's folder
// are 0700, the lock, the shard and the manifest 0600 (they were 0755 and
// 0644 under the usual umask 022). The folders above the path that zerod
// made follow the umask, as `mkdir -p -m 0700` makes them. A model's end
// takes its name out of the lock file.
TEST(Snapshots, WhatAModelMakesUnderThePathIsItsOwnersAloneWhateverTheUmask) {
  TempDir tmp;
  const std::string path = tmp.path + "/runs/job/snaps";
  {
    const UmaskFor open_to_all(0);
    auto m = make_model(snapshot_job(path), 1);
    train(*m, 2);
  }
  const std::string step = path + "/step-000000000002";
  EXPECT_EQ(mode_of(tmp.path + "/runs"), 0777u);
  EXPECT_EQ(mode_of(tmp.path + "/runs/job"), 0777u);
  EXPECT_EQ(mode_of(path), 0700u);
  EXPECT_EQ(mode_of(path + "/.zerod.lock"), 0600u);
  EXPECT_EQ(mode_of(step), 0700u);
  EXPECT_EQ(mode_of(step + "/rank-00000-of-00001.zdshard"), 0600u);
  EXPECT_EQ(mode_of(step + "/zerod-checkpoint.txt"), 0600u);
  EXPECT_EQ(text_of(path + "/.zerod.lock"), "") << "the model's end left its name in the lock file";
}

// A path the user made (its mode the user's choice, left as it is) where
// an older zerod left its lock file 0644: the model makes that file 0600.
TEST(Snapshots, ALockFileAnOlderZerodLeftOpenToAllIsMadeTheOwnersAlone) {
  TempDir tmp;
  const std::string path = tmp.path + "/snaps";
  ASSERT_TRUE(fs::create_directory(path));
  ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  const int fd = ::open((path + "/.zerod.lock").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchmod(fd, 0644), 0);
  ::close(fd);
  auto m = make_model(snapshot_job(path), 1);
  EXPECT_EQ(mode_of(path + "/.zerod.lock"), 0600u);
  EXPECT_EQ(mode_of(path), 0755u) << "the user's folder was changed";
}

// Another local user (uid 65534) opens the lock, to hold it, and a shard,
// to read the weights: the folders zerod made keep it out, and where the
// user opened them to everyone the files' own modes do.
TEST(Snapshots, AnotherUserCannotOpenTheLockOrReadAShard) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a process as uid 65534 (fork + setuid)";
  TempDir tmp;
  ASSERT_EQ(::chmod(tmp.path.c_str(), 0755), 0);  // uid 65534 reaches the folder above the path
  const std::string path = tmp.path + "/snaps";
  {
    auto m = make_model(snapshot_job(path), 1);
    train(*m, 2);
  }
  const std::string step = path + "/step-000000000002";
  const std::string lock = path + "/.zerod.lock", shard = step + "/rank-00000-of-00001.zdshard";
  EXPECT_EQ(open_as_nobody(lock), EACCES) << "uid 65534 opened " << lock;
  EXPECT_EQ(open_as_nobody(shard), EACCES) << "uid 65534 read " << shard;
  ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(step.c_str(), 0755), 0);
  EXPECT_EQ(open_as_nobody(lock), EACCES) << "uid 65534 opened " << lock << " in a folder open to everyone";
  EXPECT_EQ(open_as_nobody(shard), EACCES) << "uid 65534 read " << shard << " in a folder open to everyone";
}

// A symbolic link planted at the lock file's name (in a path others may
// write into) would have the model truncate the file it points to and write
// its name there. The model is refused, saying so, and the file is as it was.
TEST(Snapshots, ASymbolicLinkAtTheLockFileIsRefusedNotFollowed) {
  TempDir tmp;
  const std::string path = tmp.path + "/snaps", target = tmp.path + "/precious";
  ASSERT_TRUE(fs::create_directory(path));
  std::ofstream(target) << "precious\n";
  fs::create_symlink(target, path + "/.zerod.lock");
  const std::string what = refusal(snapshot_job(path));
  EXPECT_NE(what.find("snapshot.path " + path + ": " + path + "/.zerod.lock is a symbolic link, which zerod does "
                      "not follow"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("Remove it"), std::string::npos) << what;
  EXPECT_EQ(text_of(target), "precious\n");
  // One pointing nowhere is not followed to create its target either.
  fs::remove(target);
  EXPECT_NE(refusal(snapshot_job(path)).find("is a symbolic link"), std::string::npos);
  EXPECT_FALSE(fs::exists(target));
}

// A daemon that crashed left its name in the lock file; another process
// holds the file now without naming itself (as `flock` or Python's
// fcntl.flock would). The refusal named the dead pid as the holder; now it
// says a process that did not name itself holds it, which one (by
// /proc/locks) and whose, and that the pid the file names no longer holds
// it. As root the holder is a process of uid 65534, which opened the file
// before it gave up root.
TEST(Snapshots, AHolderThatDidNotNameItselfIsNotTakenForTheDeadPidTheFileNames) {
  TempDir tmp;
  const std::string path = tmp.path + "/snaps", lock = path + "/.zerod.lock";
  { auto m = make_model(snapshot_job(path), 1); }
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(exit_status(dead), 0);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string stale = "pid " + std::to_string(dead) + " on host " + host;
  std::ofstream(lock) << stale << " (old.lua, ranks 0-0)\n";
  const bool as_nobody = ::geteuid() == 0;
  const HeldElsewhere held = refusal_while_a_child_holds(path, [&] {
    const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);  // a read handle is all flock needs
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return false;
    if (as_nobody) become_nobody();
    return true;
  });
  EXPECT_EQ(held.status, 0);
  ASSERT_TRUE(held.held) << "the other process did not take the lock";
  const std::string& what = held.refusal;
  // Where the kernel lists no holder, nothing says the name is stale: it is
  // taken at its word (AHolderInAPidNamespaceThisOneCannotSeeIsNotCalledGone).
  if (what.find(stale + " (old.lua, ranks 0-0), as the lock file says") != std::string::npos)
    GTEST_SKIP() << "the kernel lists no holder of " << lock << " in /proc/locks";
  EXPECT_EQ(what.find("in use by " + stale), std::string::npos) << what;
  EXPECT_NE(what.find("snapshot.path " + path + " is in use by another process that did not name itself ("),
            std::string::npos)
      << what;
  const std::string uid = std::to_string(as_nobody ? kNobody : ::geteuid());
  EXPECT_NE(what.find("pid " + std::to_string(held.pid) + ", uid " + uid + ", as /proc/locks lists it"), std::string::npos)
      << what;
  EXPECT_NE(what.find("the lock file still names pid " + std::to_string(dead) + ", which no longer holds it), which "
                      "holds " + lock),
            std::string::npos)
      << what;
}

// The daemon holding the path runs in a PID namespace of its own (a
// container), and names itself by its pid there, 1. This process sees it
// in /proc/locks by its pid here, which is not 1: the refusal said "the lock
// file still names pid 1, which no longer holds it" of a daemon that held
// the path. Now the pid the holder has in its own namespace (NSpid) is its
// name's, and the refusal names it.
TEST(Snapshots, AHolderInAPidNamespaceOfItsOwnIsKnownByTheNameItGaveItself) {
  TempDir tmp;
  const std::string path = tmp.path + "/snaps", lock = path + "/.zerod.lock";
  { auto m = make_model(snapshot_job(path), 1); }
  const HeldElsewhere held = refusal_while_a_child_holds(path, [&] {
    enter_a_new_pid_namespace(false);
    return hold_named(lock, "contained.lua") >= 0;
  });
  if (held.status == kNoNamespace) GTEST_SKIP() << "this process may not make a PID namespace (unshare: needs root, "
                                                   "or unprivileged user namespaces)";
  EXPECT_EQ(held.status, 0);
  ASSERT_TRUE(held.held) << "the process in its own PID namespace did not take the lock";
  const std::string& what = held.refusal;
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_NE(what.find("snapshot.path " + path + " is in use by pid 1 on host " + host +
                      " (contained.lua, ranks 0-0), which holds " + lock),
            std::string::npos)
      << what;
  EXPECT_EQ(what.find("no longer holds it"), std::string::npos) << what;
}

// This daemon runs in a PID namespace of its own with its own /proc (a
// container), the path's holder outside it: /proc/locks leaves the lock
// out, and kill() finds no such pid. The refusal called the holder gone
// ("the lock file still names pid N, which no longer holds it") though it
// held the path; now the name in the file is taken at its word.
TEST(Snapshots, AHolderInAPidNamespaceThisOneCannotSeeIsNotCalledGone) {
  TempDir tmp;
  const std::string path = tmp.path + "/snaps", lock = path + "/.zerod.lock";
  { auto m = make_model(snapshot_job(path), 1); }
  const int held = hold_named(lock, "outside.lua");
  ASSERT_GE(held, 0) << "this process did not take the lock";
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string name = "pid " + std::to_string(::getpid()) + " on host " + host + " (outside.lua, ranks 0-0)";
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    enter_a_new_pid_namespace(true);
    JobOptions o = snapshot_job(path);
    o.timeout_s = 0.2;
    const std::string what = refusal(o);
    const bool written = ::write(out[1], what.data(), what.size()) == static_cast<ssize_t>(what.size());
    ::_exit(written ? 0 : 1);
  }
  ::close(out[1]);
  std::string what;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) what.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  const int status = exit_status(child);
  ::close(held);
  if (status == kNoNamespace) GTEST_SKIP() << "this process may not make a PID namespace with its own /proc "
                                              "(unshare, mount: needs root, or unprivileged user namespaces)";
  EXPECT_EQ(status, 0);
  EXPECT_NE(what.find("snapshot.path " + path + " is in use by " + name + ", as the lock file says, which holds " +
                      lock),
            std::string::npos)
      << what;
  EXPECT_EQ(what.find("no longer holds it"), std::string::npos) << what;
}

// A checkpoint the user saves (zd_model_save) is the user's to share, in a
// directory the user chose: it follows the umask (0644 files and 0777
// folders, less it), as the trainer's own files beside it do.
TEST(SavedCheckpoints, FollowTheUmask) {
  TempDir tmp;
  const std::string dir = tmp.path + "/ckpt/step2";
  {
    const UmaskFor group_reads(027);
    auto m = make_model(JobOptions{}, 1);
    train(*m, 2);
    m->save_checkpoint(0, dir);
  }
  EXPECT_EQ(mode_of(tmp.path + "/ckpt"), 0750u);
  EXPECT_EQ(mode_of(dir), 0750u);
  EXPECT_EQ(mode_of(dir + "/rank-00000-of-00001.zdshard"), 0640u);
  EXPECT_EQ(mode_of(dir + "/zerod-checkpoint.txt"), 0640u);
}

}  // namespace
