// The peer check, both ways: a process of another uid that reaches the
// socket is refused at accept, unless its uid is allowed; and a client
// refuses a daemon of another uid (not root) before it sends anything.
// Needs root to make such a process (fork, then setuid in the child).
#include "test_support.h"
#include "transport/client.h"
#include "transport/errors.h"
#include "transport/listener.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

namespace zerod::transport {
namespace {

constexpr uid_t kNobody = 65534;

// Forks a child that becomes uid/gid 65534, connects, sends one frame and
// waits for a reply. Exit status: 0 got a reply, 10 saw the connection
// closed, other values a failure along the way.
pid_t spawn_nobody_client(const std::string& path) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(20);
  try {
    Connection c = connect_unix(path, 5000);
    c.send(FrameHeader{}, test::bytes_of("hi"));
    c.receive(1024, 10000);
    ::_exit(0);
  } catch (const Error& e) {
    ::_exit(e.code() == ZD_ERR_PEER_LOST ? 10 : 21);
  } catch (...) {
    ::_exit(22);
  }
}

int wait_exit(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class PeerUid : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534 (fork + setuid)";
    // Let uid 65534 reach the socket at all, so that the SO_PEERCRED check
    // (not the file mode) is what stops it.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
    path_ = dir_.path() + "/z.sock";
  }
  void open_to_everyone(const Listener& l) { ASSERT_EQ(::chmod(l.path().c_str(), 0666), 0); }

  test::TempDir dir_;
  std::string path_;
};

TEST_F(PeerUid, AnotherUidIsRefusedAndSeesTheConnectionClosed) {
  Listener l = Listener::create_private(path_);
  open_to_everyone(l);
  const pid_t child = spawn_nobody_client(path_);
  ASSERT_GT(child, 0);
  std::optional<PeerRefused> refused;
  try {
    l.accept(10000);
  } catch (const PeerRefused& e) {
    refused = e;
  }
  const int status = wait_exit(child);
  ASSERT_TRUE(refused) << "the uid 65534 peer was accepted";
  EXPECT_EQ(refused->peer().uid, kNobody);
  EXPECT_EQ(refused->peer().pid, child);
  EXPECT_NE(std::string(refused->what()).find("permission denied"), std::string::npos)
      << refused->what();
  EXPECT_EQ(status, 10) << "the child should have seen its connection closed";
}

TEST_F(PeerUid, AnAllowedUidIsAccepted) {
  ListenerOptions options;
  options.allow_uid.insert(kNobody);
  Listener l = Listener::create_private(path_, options);
  open_to_everyone(l);
  const pid_t child = spawn_nobody_client(path_);
  ASSERT_GT(child, 0);
  std::optional<Connection> c = l.accept(10000);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->peer().uid, kNobody);
  Frame f = c->receive(1024, 10000);
  c->send(f.header, test::bytes_of("welcome"));
  EXPECT_EQ(wait_exit(child), 0);
}

// Another user's "daemon" on path_, run as uid 65534 in a child: listens,
// lets root in, and says whether any byte came before the client closed.
// Exit status: 10 nothing came, 11 a frame came, others a failure along
// the way. Returns once it listens.
pid_t start_other_users_daemon(const std::string& path) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ::close(ready[0]);
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(20);
    try {
      ListenerOptions options;
      options.allow_uid.insert(0);
      Listener l = Listener::create_private(path, options);
      (void)!::write(ready[1], "r", 1);
      std::optional<Connection> c = l.accept(10000);
      if (!c) ::_exit(21);
      c->receive(1024, 10000);
      ::_exit(11);
    } catch (const Error& e) {
      ::_exit(e.code() == ZD_ERR_PEER_LOST ? 10 : 22);
    } catch (...) {
      ::_exit(23);
    }
  }
  ::close(ready[1]);
  char byte = 0;
  const bool listening = ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  return listening ? child : -1;
}

// The other way round: a socket where a client expects its own daemon, but
// another user's process listens (a path in a shared directory, a
// ZEROD_ENDPOINT someone else set). libzerod would send it the job script
// and memfds of the trainer's tensors: connect_unix refuses it, naming the
// uid that listens, and the listener receives nothing.
TEST_F(PeerUid, AClientRefusesADaemonOfAnotherUid) {
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0777), 0);  // uid 65534 makes its socket there
  const pid_t child = start_other_users_daemon(path_);
  ASSERT_GT(child, 0) << "the uid 65534 listener did not start";
  std::optional<Error> refused;
  try {
    Connection c = connect_unix(path_, 5000);
    c.send(FrameHeader{}, test::bytes_of("the job script"));  // what a client would send next
  } catch (const Error& e) {
    refused = e;
  }
  const int status = wait_exit(child);
  ASSERT_TRUE(refused) << "the client connected to a daemon of uid 65534";
  EXPECT_EQ(refused->code(), ZD_ERR_IO);
  const std::string text = refused->what();
  EXPECT_NE(text.find("cannot connect to zerod at " + path_ + ": the process listening there (pid "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("runs as uid 65534"), std::string::npos) << text;
  EXPECT_NE(text.find("but this process is uid 0"), std::string::npos) << text;
  EXPECT_EQ(status, 10) << "the other uid's listener should have seen the connection closed with nothing sent";
}

// A server that lets another uid in (ServerOptions::allow_uid) is reached
// by a client told to trust the server's uid; a malformed value is an
// error, not a silent refusal.
TEST_F(PeerUid, AClientTrustsTheDaemonUidItIsTold) {
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0777), 0);
  const pid_t first = start_other_users_daemon(path_);
  ASSERT_GT(first, 0) << "the uid 65534 listener did not start";
  ::setenv("ZEROD_TRUST_DAEMON_UID", "65534x", 1);
  try {
    connect_unix(path_, 5000);
    ADD_FAILURE() << "a malformed ZEROD_TRUST_DAEMON_UID was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_INVALID_ARGUMENT) << e.what();
  }
  EXPECT_EQ(wait_exit(first), 10) << "nothing goes to a daemon the client does not trust";
  const pid_t child = start_other_users_daemon(path_);
  ASSERT_GT(child, 0) << "the second uid 65534 listener did not start";
  ::setenv("ZEROD_TRUST_DAEMON_UID", "65534", 1);
  std::optional<Error> refused;
  try {
    Connection c = connect_unix(path_, 5000);
    c.send(FrameHeader{}, test::bytes_of("the job script"));
  } catch (const Error& e) {
    refused = e;
  }
  ::unsetenv("ZEROD_TRUST_DAEMON_UID");
  const int status = wait_exit(child);
  EXPECT_FALSE(refused) << refused->what();
  EXPECT_EQ(status, 11) << "the trusted daemon should have received the frame";
}

}  // namespace
}  // namespace zerod::transport
