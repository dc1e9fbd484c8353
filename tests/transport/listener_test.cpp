// The listener's socket and directory, stale and live sockets, connecting,
// and the peer's credentials.
#include "transport/listener.h"
#include "test_support.h"
#include "transport/client.h"
#include "transport/errors.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/un.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>

namespace zerod::transport {
namespace {

using test::TempDir;
using test::thrown;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

// Sets an environment variable for one test and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A socket file nobody listens on: what a daemon that was killed leaves.
void make_stale_socket(const std::string& path) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  path.copy(addr.sun_path, path.size());
  ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
}

TEST(Listener, PrivateDirectoryIs0700AndSocket0600UnderXdgRuntimeDir) {
  TempDir runtime;
  ScopedEnv xdg("XDG_RUNTIME_DIR", runtime.path());
  std::string dir, path;
  {
    Listener l = Listener::create_private("");
    dir = l.directory();
    path = l.path();
    EXPECT_EQ(dir.rfind(runtime.path() + "/zerod-", 0), 0U) << dir;
    EXPECT_EQ(path, dir + "/zerod.sock");
    EXPECT_TRUE(S_ISDIR(mode_of(dir)));
    EXPECT_EQ(mode_of(dir) & 07777, 0700U);
    EXPECT_TRUE(S_ISSOCK(mode_of(path)));
    EXPECT_EQ(mode_of(path) & 07777, 0600U);
  }
  // The destructor removed what it made.
  EXPECT_FALSE(exists(path));
  EXPECT_FALSE(exists(dir));
  EXPECT_TRUE(exists(runtime.path()));
}

TEST(Listener, FallsBackToTmpWhenXdgRuntimeDirIsUnusable) {
  // The last one exists and is writable, but a socket under it would not
  // fit sun_path.
  TempDir base;
  const std::string too_long = base.path() + "/" + std::string(80, 'x');
  ASSERT_EQ(::mkdir(too_long.c_str(), 0700), 0);
  for (const std::string& bad :
       {std::string("/nonexistent/run"), std::string("relative/run"), too_long}) {
    ScopedEnv xdg("XDG_RUNTIME_DIR", bad);
    Listener l = Listener::create_private("");
    EXPECT_EQ(l.directory().rfind("/tmp/zerod-", 0), 0U)
        << "XDG_RUNTIME_DIR=" << bad << ": " << l.directory();
  }
}

TEST(Listener, TheUmaskDoesNotWidenOrNarrowTheModes) {
  const mode_t old = ::umask(0);
  Listener wide = Listener::create_private("");
  ::umask(0277);
  Listener narrow = Listener::create_private("");
  ::umask(old);
  for (const Listener* l : {&wide, &narrow}) {
    EXPECT_EQ(mode_of(l->directory()) & 07777, 0700U);
    EXPECT_EQ(mode_of(l->path()) & 07777, 0600U);
  }
}

TEST(Listener, ConnectAcceptAndPeerCredentials) {
  Listener l = Listener::create_private("");
  Connection client = connect_unix(l.path(), 1000);
  std::optional<Connection> server = l.accept(1000);
  ASSERT_TRUE(server);
  const PeerCredentials seen_by_server = server->peer();
  EXPECT_EQ(seen_by_server.pid, ::getpid());
  EXPECT_EQ(seen_by_server.uid, ::geteuid());
  EXPECT_EQ(seen_by_server.gid, ::getegid());
  EXPECT_EQ(client.peer().pid, ::getpid());
  EXPECT_EQ(client.label(), "zerod at " + l.path());
  EXPECT_EQ(server->label(), "peer pid " + std::to_string(::getpid()));
  EXPECT_TRUE(::fcntl(server->fd(), F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(::fcntl(client.fd(), F_GETFD) & FD_CLOEXEC);

  FrameHeader h;
  h.request_id = 11;
  client.send(h, test::bytes_of("hello"));
  Frame f = server->receive(1024, 1000);
  EXPECT_EQ(f.header.request_id, 11U);
  server->send(f.header, test::bytes_of("world"));
  EXPECT_EQ(client.receive(1024, 1000).body.size(), 5U);
}

TEST(Listener, AcceptTimesOut) {
  Listener l = Listener::create_private("");
  auto e = thrown<Error>([&] { l.accept(30); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_TIMEOUT);
}

TEST(Listener, AStaleSocketIsReplacedAndALiveOneRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/z.sock";
  make_stale_socket(path);
  ASSERT_TRUE(S_ISSOCK(mode_of(path)));
  {
    Listener first = Listener::create_private(path);
    EXPECT_EQ(first.path(), path);
    EXPECT_TRUE(first.directory().empty());
    EXPECT_EQ(mode_of(path) & 07777, 0600U);

    auto e = thrown<Error>([&] { Listener::create_private(path); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), ZD_ERR_IO);
    EXPECT_TRUE(contains(e->what(), "another zerod is serving " + path)) << e->what();
    // The refused attempt left the live daemon's socket alone.
    Connection c = connect_unix(path, 1000);
    EXPECT_TRUE(first.accept(1000));
  }
  EXPECT_FALSE(exists(path));
  EXPECT_TRUE(exists(dir.path()));  // not ours to remove
}

TEST(Listener, RefusesToReplaceSomethingThatIsNotASocket) {
  TempDir dir;
  const std::string path = dir.path() + "/z.sock";
  std::ofstream(path) << "precious";
  auto e = thrown<Error>([&] { Listener::create_private(path); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_IO);
  EXPECT_TRUE(contains(e->what(), "is not a socket; refusing to replace it")) << e->what();
  std::string content;
  std::ifstream(path) >> content;
  EXPECT_EQ(content, "precious");
}

TEST(Listener, TheParentDirectoryMustExist) {
  TempDir dir;
  const std::string path = dir.path() + "/missing/z.sock";
  auto e = thrown<Error>([&] { Listener::create_private(path); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_IO);
  EXPECT_TRUE(contains(e->what(), dir.path() + "/missing: No such file or directory")) << e->what();
}

TEST(Listener, PathsTooLongForSunPathAreRefusedNamingTheLimit) {
  const std::string path = "/tmp/" + std::string(150, 'p') + ".sock";
  auto e = thrown<Error>([&] { Listener::create_private(path); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(e->what(), "limited to 107 bytes")) << e->what();
  auto c = thrown<Error>([&] { connect_unix(path, 0); });
  ASSERT_TRUE(c);
  EXPECT_EQ(c->code(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(c->what(), "limited to 107 bytes")) << c->what();
}

TEST(Listener, TheDestructorLeavesASuccessorsSocketAlone) {
  TempDir dir;
  const std::string path = dir.path() + "/z.sock";
  std::optional<Listener> old = Listener::create_private(path);
  ASSERT_EQ(::unlink(path.c_str()), 0);                 // someone removed it...
  Listener successor = Listener::create_private(path);  // ...and a new daemon took the path
  old.reset();
  EXPECT_TRUE(exists(path));
  Connection c = connect_unix(path, 1000);
  EXPECT_TRUE(successor.accept(1000));
}

TEST(Listener, MovingKeepsOneOwnerOfTheFiles) {
  std::string path;
  {
    Listener a = Listener::create_private("");
    path = a.path();
    Listener b = std::move(a);
    Listener c = Listener::create_private("");
    const std::string c_path = c.path();
    c = std::move(b);  // c's own socket goes, b's moves in
    EXPECT_FALSE(exists(c_path));
    EXPECT_EQ(c.path(), path);
    EXPECT_TRUE(exists(path));
    Connection client = connect_unix(path, 1000);
    EXPECT_TRUE(c.accept(1000));
  }
  EXPECT_FALSE(exists(path));
}

TEST(Client, ConnectErrorsSayWhatToCheck) {
  TempDir dir;
  const std::string missing = dir.path() + "/none.sock";
  auto e = thrown<Error>([&] { connect_unix(missing, 100); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), ZD_ERR_IO);
  EXPECT_EQ(std::string(e->what()), "cannot connect to zerod at " + missing +
                                        ": No such file or directory — is the daemon running?");

  const std::string stale = dir.path() + "/stale.sock";
  make_stale_socket(stale);
  auto r = thrown<Error>([&] { connect_unix(stale, 100); });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->code(), ZD_ERR_IO);
  EXPECT_TRUE(contains(r->what(), "Connection refused")) << r->what();
}

TEST(Client, ConnectTimesOutWhileTheAcceptQueueIsFull) {
  ListenerOptions options;
  options.backlog = 0;  // Linux still queues one
  Listener l = Listener::create_private("", options);
  std::vector<Connection> queued;
  std::optional<Error> timeout;
  for (int i = 0; i < 8 && !timeout; ++i) {
    try {
      queued.push_back(connect_unix(l.path(), 30));
    } catch (const Error& e) {
      timeout = e;
    }
  }
  ASSERT_TRUE(timeout) << "the accept queue never filled";
  EXPECT_EQ(timeout->code(), ZD_ERR_TIMEOUT);
  EXPECT_TRUE(contains(timeout->what(), "accept queue stayed full")) << timeout->what();
  // Once the daemon accepts, connecting works again.
  for (std::size_t i = 0; i < queued.size(); ++i) EXPECT_TRUE(l.accept(1000));
  Connection late = connect_unix(l.path(), 1000);
  EXPECT_TRUE(l.accept(1000));
}

TEST(Client, ConnectWaitsForRoomInTheAcceptQueue) {
  ListenerOptions options;
  options.backlog = 0;
  Listener l = Listener::create_private("", options);
  std::vector<Connection> queued;
  try {
    for (int i = 0; i < 8; ++i) queued.push_back(connect_unix(l.path(), 0));
  } catch (const Error& e) {
    ASSERT_EQ(e.code(), ZD_ERR_TIMEOUT) << e.what();
  }
  // The queue is full; this connect retries until the daemon accepts.
  auto waiting = std::async(std::launch::async, [&l] { return connect_unix(l.path(), 30000); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  for (std::size_t i = 0; i < queued.size(); ++i) EXPECT_TRUE(l.accept(1000));
  Connection c = waiting.get();
  std::optional<Connection> s = l.accept(1000);
  ASSERT_TRUE(s);
  c.send(FrameHeader{}, test::bytes_of("made it"));
  EXPECT_EQ(s->receive(1024, 1000).body.size(), 7U);
}

}  // namespace
}  // namespace zerod::transport
