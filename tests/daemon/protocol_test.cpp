// The daemon's protocol against a server in this process: malformed frames
// get an error reply and nobody else notices; hello and rank rules; the
// socket's place and modes; status; runs of a daemon that serves one job
// after another; the bounds on connections (observers, threads).
#include "ring_call.h"
#include "server.h"
#include "sizes.h"
#include "status.h"
#include "transport/client.h"
#include "transport/ring.h"
#include "wire.h"

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace zerod;

namespace {

struct Fixture : ::testing::Test {
  void SetUp() override {
    server::ServerOptions o;
    o.world_size = 1;
    o.reclaim_wait_ms = 100;
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  void TearDown() override { srv->stop(); }

  transport::Connection connect() { return transport::connect_unix(srv->socket_path(), 2000); }

  static v1::Reply rpc(transport::Connection& c, const v1::Request& req, uint32_t id = 1) {
    wire::send(c, wire::kRequest, id, req);
    transport::Frame f = c.receive(wire::kMaxBody, 5000);
    EXPECT_EQ(f.header.request_id, id);
    v1::Reply r;
    wire::parse(f, &r, "reply");
    return r;
  }
  static v1::Request hello(const char* role = "rank", int rank = 0, int world = 1) {
    v1::Request r;
    r.mutable_hello()->set_abi_version(ZD_ABI_VERSION);
    r.mutable_hello()->set_role(role);
    r.mutable_hello()->set_rank(rank);
    r.mutable_hello()->set_world_size(world);
    return r;
  }
  static v1::Request create(const std::string& text) {
    v1::Request r;
    r.mutable_create_model()->set_script_text(text);
    r.mutable_create_model()->set_script_name("p.lua");
    return r;
  }
  // A model of the script with one parameter, "w" (8 f32) in module "m",
  // on a connection that said hello: its id (requests 2 and 3).
  static int model_with_one_param(transport::Connection& c, const std::string& script) {
    v1::Reply r = rpc(c, create(script), 2);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    const int model = r.create_model().model();
    v1::Request reg;
    v1::RegisterParam* p = reg.mutable_register_param();
    p->set_model(model);
    p->set_name("w");
    p->set_module("m");
    p->set_dtype(ZD_DTYPE_F32);
    p->add_shape(8);
    r = rpc(c, reg, 3);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    return model;
  }
  // Sends raw bytes, then reads one reply.
  static v1::Reply raw(transport::Connection& c, const void* bytes, size_t n) {
    EXPECT_EQ(::write(c.fd(), bytes, n), static_cast<ssize_t>(n));
    transport::Frame f = c.receive(wire::kMaxBody, 5000);
    v1::Reply r;
    wire::parse(f, &r, "reply");
    return r;
  }

  std::unique_ptr<server::Server> srv;
};

}  // namespace

TEST_F(Fixture, TheSocketIsPrivate) {
  struct stat st{};
  ASSERT_EQ(stat(srv->socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string dir = srv->socket_path().substr(0, srv->socket_path().rfind('/'));
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(Fixture, HelloComesFirstAndChecksTheJob) {
  auto c = connect();
  v1::Reply r = rpc(c, create("return {}"));
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_STATE);
  EXPECT_NE(r.error().message().find("before hello"), std::string::npos);
  r = rpc(c, hello("rank", 0, 3));
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error().message().find("ZEROD_WORLD_SIZE"), std::string::npos) << r.error().message();
  v1::Request newer = hello();
  newer.mutable_hello()->set_abi_version((ZD_ABI_VERSION_MAJOR + 1) << 16);
  r = rpc(c, newer);
  EXPECT_EQ(r.error().status(), ZD_ERR_VERSION);
  r = rpc(c, hello());
  ASSERT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(r.hello().world_size(), 1);
}

TEST_F(Fixture, ARankConnectsOnce) {
  auto a = connect();
  ASSERT_FALSE(rpc(a, hello()).has_error());
  auto b = connect();
  const v1::Reply r = rpc(b, hello());
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_STATE);
  EXPECT_NE(r.error().message().find("rank 0 is already connected"), std::string::npos);
}

TEST_F(Fixture, MalformedFramesGetAnErrorAndOthersAreStillServed) {
  auto good = connect();
  ASSERT_FALSE(rpc(good, hello()).has_error());

  // Oversize: refused before the body is read; the connection goes on.
  auto big = connect();
  transport::FrameHeader h;
  h.length = wire::kMaxBody + 1;
  h.request_id = 7;
  h.type = wire::kRequest;
  const auto bytes = transport::encode_header(h);
  std::string body(h.length, 'x');
  ASSERT_EQ(::write(big.fd(), bytes.data(), bytes.size()), 16);
  std::thread writer([&] { (void)!::write(big.fd(), body.data(), body.size()); });
  transport::Frame f = big.receive(wire::kMaxBody, 10000);
  writer.join();
  v1::Reply r;
  wire::parse(f, &r, "reply");
  EXPECT_EQ(f.header.request_id, 7u);
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error().message().find("rejected frame"), std::string::npos) << r.error().message();
  EXPECT_FALSE(rpc(big, hello("observer"), 8).has_error()) << "the oversize sender is still served";

  // A body that is not a request: an error reply, the connection goes on.
  auto junk = connect();
  transport::FrameHeader jh;
  jh.length = 5;
  jh.request_id = 3;
  jh.type = wire::kRequest;
  const auto jb = transport::encode_header(jh);
  std::string raw_frame(reinterpret_cast<const char*>(jb.data()), jb.size());
  raw_frame += "\xff\xff\xff\xff\xff";
  r = raw(junk, raw_frame.data(), raw_frame.size());
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error().message().find("malformed request"), std::string::npos) << r.error().message();
  EXPECT_FALSE(rpc(junk, hello("observer"), 4).has_error());

  // Not a zerod frame at all: an error reply, then that connection closes.
  auto http = connect();
  const char get[] = "GET / HTTP/1.1\r\n\r\n";
  r = raw(http, get, sizeof get - 1);
  EXPECT_EQ(r.error().status(), ZD_ERR_VERSION);
  try {
    http.receive(wire::kMaxBody, 2000);
    ADD_FAILURE() << "the daemon kept a connection whose frames it cannot find";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_PEER_LOST) << e.what();
  }

  // The well-behaved client never noticed.
  r = rpc(good, create("return { optimizer = { type = 'sgd' } }"), 2);
  EXPECT_FALSE(r.has_error()) << r.error().message();
}

TEST_F(Fixture, StatusShowsModelsAndRanks) {
  auto rank = connect();
  ASSERT_FALSE(rpc(rank, hello()).has_error());
  v1::Reply r = rpc(rank, create("return { optimizer = { type = 'sgd' }, zero = { stage = 1 } }"), 2);
  ASSERT_FALSE(r.has_error()) << r.error().message();
  auto obs = connect();
  ASSERT_FALSE(rpc(obs, hello("observer")).has_error());
  v1::Request q;
  q.mutable_status();
  r = rpc(obs, q, 2);
  ASSERT_FALSE(r.has_error());
  ASSERT_EQ(r.status().models_size(), 1);
  EXPECT_EQ(r.status().models(0).zero_stage(), 1);
  EXPECT_EQ(r.status().models(0).ranks(0).connected(), true);
  const std::string text = server::format_status(r.status());
  EXPECT_NE(text.find("ZeRO stage 1"), std::string::npos) << text;
  EXPECT_NE(text.find("p.lua"), std::string::npos) << text;
  // An observer cannot act as a rank.
  EXPECT_EQ(rpc(obs, create("return {}"), 3).error().status(), ZD_ERR_INVALID_STATE);
}

// The call ring's deferred zd_forward_end (libzerod/src/remote.cpp): the daemon
// runs it before the request's own call; its error is the reply's, says
// whose it is, and the request's call does not run; a request may carry
// nothing but a forward_end that way.
TEST_F(Fixture, ADeferredForwardEndRunsFirstAndNothingElseMayBeDeferred) {
  auto c = connect();
  ASSERT_FALSE(rpc(c, hello()).has_error());
  const int model = model_with_one_param(c, "return { optimizer = { type = 'sgd' } }");
  ASSERT_FALSE(HasFailure());
  v1::Reply r;

  constexpr uint64_t kBytes = uint64_t{1} << 20;
  transport::UniqueFd fd;
  transport::Ring ring = transport::Ring::create(kBytes, wire::kRingRequestBytes, &fd);
  v1::Request setup;
  setup.mutable_ring()->set_size(kBytes);
  const int fds[1] = {fd.get()};
  wire::send(c, wire::kRequest, 4, setup, fds);
  transport::Frame f = c.receive(wire::kMaxBody, 5000);
  wire::parse(f, &r, "reply");
  ASSERT_FALSE(r.has_error()) << r.error().message();

  struct Answer {
    int32_t status;
    std::string message;
  };
  auto call = [&](calls::Op op, int32_t has_deferred, calls::Op deferred) {
    wire::RingRequest q{};
    q.kind = wire::RingKind::call;
    q.model = model;
    q.args.op = op;
    q.has_deferred = has_deferred;
    q.deferred.op = deferred;
    std::memcpy(ring.request_slot().data(), &q, sizeof q);
    ring.post_request();
    transport::RingWait w;
    w.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    EXPECT_EQ(ring.wait_reply(w), transport::RingWaitEnd::ready);
    wire::RingReply rep;
    std::memcpy(&rep, ring.reply_slot().data(), sizeof rep);
    if (rep.arenas_follow) c.receive(wire::kMaxBody, 5000);  // finalize's arenas
    const auto* text = reinterpret_cast<const char*>(ring.reply_slot().data()) + sizeof rep +
                       uint64_t{rep.view_count} * sizeof(wire::RingView);
    return Answer{rep.status, std::string(text, rep.message_bytes)};
  };
  using calls::Op;
  ASSERT_EQ(call(Op::finalize, 0, Op::finalize).status, ZD_OK);

  // Anything but a forward_end, or a flag other than 0 and 1, is refused.
  for (auto [flag, op] : {std::pair{1, Op::step}, std::pair{2, Op::forward_end}, std::pair{-1, Op::forward_end}}) {
    const Answer a = call(Op::forward_begin, flag, op);
    EXPECT_EQ(a.status, ZD_ERR_INVALID_ARGUMENT);
    EXPECT_NE(a.message.find("only a deferred zd_forward_end"), std::string::npos) << a.message;
  }
  // An end of a module not in forward: its error, said to be the end's, and
  // the begin it came with did not run (it runs now without complaint).
  Answer a = call(Op::forward_begin, 1, Op::forward_end);
  EXPECT_EQ(a.status, ZD_ERR_INVALID_STATE);
  EXPECT_NE(a.message.find("not in forward"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("zd_forward_end of module 0, which the client sent with this rank's next call, "
                           "zd_forward_begin; that call did not run"),
            std::string::npos)
      << a.message;
  a = call(Op::forward_begin, 0, Op::forward_end);
  EXPECT_EQ(a.status, ZD_OK) << a.message;
  // The end runs before the begin it travels with: a begin of a module
  // still in forward would fail.
  a = call(Op::forward_begin, 1, Op::forward_end);
  EXPECT_EQ(a.status, ZD_OK) << a.message;
  a = call(Op::forward_end, 0, Op::forward_end);
  EXPECT_EQ(a.status, ZD_OK) << a.message;
}

// Without a ring, a model call is the ring's record in a type 3 frame,
// answered by a type 4 frame holding what the reply slot would: the same
// checks (a record of the wrong size, fds, an unknown op, a call before
// hello or by an observer are each an error record, and the connection goes
// on), views after a begin, and optimizer_info's names as NUL-ended text.
TEST_F(Fixture, CallFramesCarryTheRingsRecords) {
  struct Answer {
    wire::RingReply rep;
    std::vector<wire::RingView> views;
    std::string text;
  };
  uint32_t id = 100;
  auto send_call = [&](transport::Connection& c, const void* body, size_t n, std::span<const int> fds = {}) {
    const uint32_t my = id++;
    wire::send_bytes(c, wire::kCall, my, std::span(static_cast<const std::byte*>(body), n), fds);
    transport::Frame f = c.receive(wire::kMaxBody, 5000);
    if (f.header.type == wire::kReply) f = c.receive(wire::kMaxBody, 5000);  // new arenas first
    EXPECT_EQ(f.header.type, wire::kCallReply);
    EXPECT_EQ(f.header.request_id, my);
    Answer a{};
    EXPECT_GE(f.body.size(), sizeof a.rep);
    std::memcpy(&a.rep, f.body.data(), sizeof a.rep);
    const std::byte* tail = f.body.data() + sizeof a.rep;
    EXPECT_EQ(f.body.size(), sizeof a.rep + a.rep.view_count * sizeof(wire::RingView) + a.rep.message_bytes);
    a.views.resize(a.rep.view_count);
    if (!a.views.empty()) std::memcpy(a.views.data(), tail, a.views.size() * sizeof(wire::RingView));
    a.text.assign(reinterpret_cast<const char*>(tail) + a.views.size() * sizeof(wire::RingView), a.rep.message_bytes);
    return a;
  };
  auto record = [](int model, calls::Op op, int module = 0) {
    wire::RingRequest q{};
    q.kind = wire::RingKind::call;
    q.model = model;
    q.args.op = op;
    q.args.module = module;
    return q;
  };

  auto c = connect();
  wire::RingRequest q = record(0, calls::Op::finalize);
  Answer a = send_call(c, &q, sizeof q);
  EXPECT_EQ(a.rep.status, ZD_ERR_INVALID_STATE);
  EXPECT_NE(a.text.find("a model call before hello"), std::string::npos) << a.text;

  v1::Reply r = rpc(c, hello(), 1);
  ASSERT_FALSE(r.has_error());
  EXPECT_TRUE(r.hello().call_records());
  const int model = model_with_one_param(c, "return { optimizer = { type = 'sgd', momentum = 0.9 } }");
  ASSERT_FALSE(HasFailure());

  a = send_call(c, &q, sizeof q - 1);
  EXPECT_EQ(a.rep.status, ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(a.text.find("one call record of " + std::to_string(sizeof q) + " bytes, not " +
                        std::to_string(sizeof q - 1)),
            std::string::npos)
      << a.text;
  const transport::UniqueFd memfd = transport::create_sealed_memfd("stray", 4096);
  const int stray[1] = {memfd.get()};
  q = record(model, calls::Op::finalize);
  a = send_call(c, &q, sizeof q, stray);
  EXPECT_EQ(a.rep.status, ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(a.text.find("carries no fds"), std::string::npos) << a.text;
  wire::RingRequest bad = record(model, static_cast<calls::Op>(1000));
  a = send_call(c, &bad, sizeof bad);
  EXPECT_EQ(a.rep.status, ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(a.text.find("unknown model call 1000"), std::string::npos) << a.text;
  bad = record(model, calls::Op::param_view);
  a = send_call(c, &bad, sizeof bad);
  EXPECT_EQ(a.rep.status, ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(a.text.find("zd_param_view is answered by libzerod"), std::string::npos) << a.text;

  a = send_call(c, &q, sizeof q);
  ASSERT_EQ(a.rep.status, ZD_OK) << a.text;
  q = record(model, calls::Op::forward_begin);
  a = send_call(c, &q, sizeof q);
  ASSERT_EQ(a.rep.status, ZD_OK) << a.text;
  ASSERT_EQ(a.views.size(), 1u);
  EXPECT_EQ(a.views[0].param, 0);
  EXPECT_EQ(a.views[0].gradient, 0);
  EXPECT_EQ(a.views[0].bytes, 8 * sizeof(float));
  q = record(model, calls::Op::optimizer_info);
  a = send_call(c, &q, sizeof q);
  ASSERT_EQ(a.rep.status, ZD_OK) << a.text;
  EXPECT_EQ(a.text, std::string("sgd\0momentum_buffer\0", 20));

  // An observer may not make model calls; the rank's connection is still served.
  auto obs = connect();
  ASSERT_FALSE(rpc(obs, hello("observer"), 1).has_error());
  a = send_call(obs, &q, sizeof q);
  EXPECT_EQ(a.rep.status, ZD_ERR_INVALID_STATE);
  EXPECT_NE(a.text.find("from an observer connection"), std::string::npos) << a.text;
  q = record(model, calls::Op::forward_end);
  EXPECT_EQ(send_call(c, &q, sizeof q).rep.status, ZD_OK);
}

// `zerod serve --jobs` (server::ServerOptions::multi_job): a rank's hello
// names its job; two jobs' rank 0s are two ranks; a rank of several that
// names none, one whose job says another world size, and one whose ranks
// are not all on this node are refused, saying why.
namespace {

struct MultiJob : Fixture {
  void SetUp() override {
    server::ServerOptions o;
    o.multi_job = true;
    o.host_memory = 1 << 20;
    o.reclaim_wait_ms = 100;
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  static v1::Request hello_of(const char* key, int rank, int world, int local_world = 0) {
    v1::Request r = hello("rank", rank, world);
    r.mutable_hello()->set_job_key(key);
    r.mutable_hello()->set_local_world_size(local_world);
    return r;
  }
};

}  // namespace

TEST_F(MultiJob, EachJobHasItsOwnRanks) {
  auto a0 = connect(), b0 = connect(), a0_again = connect();
  v1::Reply r = rpc(a0, hello_of("a;", 0, 2));
  ASSERT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(r.hello().world_size(), 2);
  r = rpc(b0, hello_of("b;", 0, 3));
  ASSERT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(r.hello().world_size(), 3);
  r = rpc(a0_again, hello_of("a;", 0, 2));
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_STATE);
  EXPECT_NE(r.error().message().find("rank 0 is already connected"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("in job 0 (a;)"), std::string::npos) << r.error().message();
  EXPECT_EQ(srv->jobs().size(), 2u);
}

TEST_F(MultiJob, WhatCannotJoinIsRefusedSayingWhy) {
  auto c = connect();
  v1::Reply r = rpc(c, hello_of("", 1, 2));
  EXPECT_EQ(r.error().status(), ZD_ERR_CONFIG);
  EXPECT_NE(r.error().message().find("ZEROD_JOB_KEY"), std::string::npos) << r.error().message();
  r = rpc(c, hello_of("k;", 0, 4, 2));
  EXPECT_EQ(r.error().status(), ZD_ERR_CONFIG);
  EXPECT_NE(r.error().message().find("2 of its job's 4 ranks run on this node"), std::string::npos)
      << r.error().message();
  auto first = connect();
  ASSERT_FALSE(rpc(first, hello_of("k;", 0, 2)).has_error());
  r = rpc(c, hello_of("k;", 1, 3));
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error().message().find("says its job has 3 ranks but job"), std::string::npos) << r.error().message();
  // A process alone is a job of its own, keyed by its connection.
  r = rpc(c, hello_of("", 0, 1));
  ASSERT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(srv->jobs().size(), 2u);
}

TEST_F(MultiJob, AJobIsForgottenWhenItsRanksAreGone) {
  {
    auto c = connect();
    ASSERT_FALSE(rpc(c, hello_of("gone;", 0, 1)).has_error());
    EXPECT_EQ(srv->jobs().size(), 1u);
  }
  for (int i = 0; i < 100 && !srv->jobs().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(srv->jobs().empty());
}

TEST_F(MultiJob, StatusSaysWhatTheJobsHold) {
  auto c = connect();
  ASSERT_FALSE(rpc(c, hello("observer")).has_error());
  v1::Request req;
  req.mutable_status();
  const v1::Reply r = rpc(c, req);
  ASSERT_TRUE(r.has_status()) << r.error().message();
  EXPECT_EQ(r.status().host_memory(), 1u << 20);
  EXPECT_EQ(r.status().host_memory_held(), 0u);
  EXPECT_NE(
      server::format_status(r.status()).find("serving 0 jobs; their planned model state holds 0 B of the 1.00 MiB"),
      std::string::npos)
      << server::format_status(r.status());
}

// A hello claims its job's world size; the daemon keeps a table per job
// from it, so the claim is bounded (wire::kMaxWorldSize, libzerod's bound
// on ZEROD_WORLD_SIZE too) before anything is made. A claim of 50,000,000
// ranks once took the daemon from 10 MB to 400 MB.
TEST_F(MultiJob, AClaimedWorldSizeIsBoundedBeforeAnythingIsMade) {
  auto c = connect();
  for (const int world : {std::numeric_limits<int>::max(), static_cast<int>(wire::kMaxWorldSize) + 1}) {
    const v1::Reply r = rpc(c, hello_of("huge;", 0, world));
    EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_ARGUMENT);
    EXPECT_NE(r.error().message().find("says its job has " + std::to_string(world) + " ranks; a job has at most " +
                                       std::to_string(wire::kMaxWorldSize)),
              std::string::npos)
        << r.error().message();
  }
  EXPECT_TRUE(srv->jobs().empty());
  EXPECT_FALSE(rpc(c, hello_of("huge;", 0, 2)).has_error()) << "the connection is still served";
}

// A connection that never says hello is closed after hello_timeout_ms
// (30 s by default), with an error reply saying why; and no more than
// max_waiting_for_hello wait at once: the next one closes the one that has
// waited longest, once that one has waited hello_grace_ms (ranks starting
// together are not closed for being many). Each waiting connection holds a
// thread of the daemon's; 100 idle connections were 100 threads. A client
// that says hello as it connects is served throughout.
namespace {

struct WaitingForHello : Fixture {
  virtual int hello_timeout_ms() const { return 1500; }
  void SetUp() override {
    server::ServerOptions o;
    o.world_size = 1;
    o.reclaim_wait_ms = 100;
    o.hello_timeout_ms = hello_timeout_ms();
    o.max_waiting_for_hello = 4;
    o.hello_grace_ms = 300;
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  // Whether the daemon closed c: its error reply, if any, then end of stream.
  static bool closed_by_daemon(transport::Connection& c, std::string* said) {
    try {
      for (;;) {
        transport::Frame f = c.receive(wire::kMaxBody, 5000);
        v1::Reply r;
        wire::parse(f, &r, "reply");
        *said += r.error().message();
      }
    } catch (const Error& e) {
      return e.code() == ZD_ERR_PEER_LOST;
    }
  }
};

// The cap's test keeps its waiting connections open for as long as a
// loaded machine may take to run it: their deadline far beyond its steps.
struct WaitingForHelloCap : WaitingForHello {
  int hello_timeout_ms() const override { return 20000; }
};

}  // namespace

TEST_F(WaitingForHello, AConnectionThatSaysNoHelloIsClosedSayingWhy) {
  auto idle = connect();
  auto prompt = connect();
  ASSERT_FALSE(rpc(prompt, hello("observer")).has_error());
  std::string said;
  EXPECT_TRUE(closed_by_daemon(idle, &said)) << "the idle connection was not closed";
  EXPECT_NE(said.find("the daemon closes a connection that it sent no hello within 1.5 s of connecting"),
            std::string::npos)
      << said;
  // A connection that said hello has no deadline: it is served after it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  v1::Request q;
  q.mutable_status();
  EXPECT_FALSE(rpc(prompt, q, 2).has_error());
}

TEST_F(WaitingForHelloCap, AtMostSoManyWaitAndTheOldestGoesOnceItHadTime) {
  using Clock = std::chrono::steady_clock;
  std::vector<transport::Connection> idle;
  const Clock::time_point first = Clock::now();
  for (int i = 0; i < 4; ++i) {
    idle.push_back(connect());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // accepted in this order
  }
  auto prompt = connect();  // the fifth waits: the first goes, once it has waited 300 ms
  ASSERT_FALSE(rpc(prompt, hello()).has_error()) << "a client saying hello at once was refused";
  EXPECT_GE(Clock::now() - first, std::chrono::milliseconds(300)) << "a connection younger than the grace was closed";
  std::string said;
  EXPECT_TRUE(closed_by_daemon(idle[0], &said)) << "the oldest waiting connection was not closed";
  // The others are still open, until their own deadline.
  pollfd p{idle[1].fd(), POLLIN | POLLRDHUP, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "the second connection was closed too early";
}

// A daemon of two ranks serving run after run (`zerod serve --nproc 2
// --job`): each run's k-th zd_model_create lands on one model on every
// rank, whatever an earlier run left uneven. The count of creates once ran
// on from run to run per rank: after a run whose rank 0 created a model and
// whose rank 1 died before its create (or a create that failed on one
// rank), rank 0's k-th create met rank 1's (k-1)-th, a model of its own,
// and both waited in their collectives until comm.timeout, told that the
// other had "not arrived".
namespace {

struct TwoRanks : Fixture {
  void SetUp() override {
    server::ServerOptions o;
    o.world_size = 2;
    o.reclaim_wait_ms = 5000;  // a rank's new connection waits for its old one's end
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  static constexpr const char* kScript = "return { optimizer = { type = 'sgd' } }";
  // A connection that said hello as `rank` of 2.
  transport::Connection rank_of_two(int rank) {
    transport::Connection c = connect();
    const v1::Reply r = rpc(c, hello("rank", rank, 2));
    EXPECT_FALSE(r.has_error()) << r.error().message();
    return c;
  }
  // The model the connection's create of kScript got, or -1.
  static int create_model(transport::Connection& c, uint32_t id) {
    const v1::Reply r = rpc(c, create(kScript), id);
    EXPECT_FALSE(r.has_error()) << r.error().message();
    return r.has_error() ? -1 : r.create_model().model();
  }
};

}  // namespace

TEST_F(TwoRanks, ARunsCreatesMeetThoughTheLastRunsRank1NeverCreated) {
  {
    transport::Connection a = rank_of_two(0);
    ASSERT_GE(create_model(a, 2), 0);
  }  // rank 0 goes; rank 1 never came: the run is over
  transport::Connection b = rank_of_two(0);  // once a's session has ended
  transport::Connection c = rank_of_two(1);
  const int mb = create_model(b, 2);
  const int mc = create_model(c, 2);
  EXPECT_GE(mb, 0);
  EXPECT_EQ(mb, mc) << "the new run's first creates landed on two models";
}

TEST_F(TwoRanks, ARunsCreatesAreNotFailedByTheLastRunsFailedCreate) {
  {
    // The script loads and the model's build fails (the device its create
    // names is none): every rank's create of it gets that error, and counts it.
    transport::Connection a = rank_of_two(0);
    v1::Request req = create(kScript);
    req.mutable_create_model()->set_device("no_such_device");
    const v1::Reply r = rpc(a, req, 2);
    ASSERT_TRUE(r.has_error());
    EXPECT_NE(r.error().message().find("no_such_device"), std::string::npos) << r.error().message();
  }
  transport::Connection b = rank_of_two(0);
  transport::Connection c = rank_of_two(1);
  const int mb = create_model(b, 2);
  const int mc = create_model(c, 2);
  EXPECT_GE(mb, 0);
  EXPECT_EQ(mb, mc);
}

TEST_F(TwoRanks, ACreateWhoseScriptDoesNotLoadOnOneRankIsNotCounted) {
  transport::Connection b = rank_of_two(0);
  transport::Connection c = rank_of_two(1);
  const v1::Reply r = rpc(b, create("return {"), 2);  // rank 0's own error: its script does not parse
  ASSERT_TRUE(r.has_error());
  EXPECT_NE(r.error().message().find("p.lua"), std::string::npos) << r.error().message();
  const int mb = create_model(b, 3);  // still rank 0's first model
  const int mc = create_model(c, 2);
  EXPECT_GE(mb, 0);
  EXPECT_EQ(mb, mc);
}

// A daemon stopped (`zerod serve`'s SIGTERM) with rank 0 in zd_model_finalize
// and rank 1 never come: the job fails on rank 0 with "the daemon is
// stopping (signal 15)", logged as info. It was "rank 0 was lost: the daemon
// is stopping", logged as an error, blaming the rank for a stop that was
// asked for, and rank 1, which never came, "returned from (none yet) 2.0 s
// ago and has not called since". Rank 1 is one that has not created the
// model, not one that "never connected": the model cannot tell that from a
// rank connected and still at another model of its trainer's.
TEST_F(TwoRanks, AStopFailsTheJobBlamingNoRankAndSaysWhichHasNotCreatedTheModel) {
  transport::Connection a = rank_of_two(0);
  const int model = model_with_one_param(a, kScript);
  ASSERT_GE(model, 0);
  std::string replied;  // the finalize's error, when its reply beat the stop's close of the connection
  std::thread finalize([&] {
    v1::Request req;
    req.mutable_call()->set_model(model);
    req.mutable_call()->set_op(v1::ModelCall::FINALIZE);
    try {
      const v1::Reply r = rpc(a, req, 4);
      replied = r.has_error() ? r.error().message() : "(no error)";
    } catch (const Error&) {
    }
  });
  // Held past the stop, which lets the daemon's models go: where the job's failure is kept.
  const std::vector<std::shared_ptr<server::ModelHost>> models = srv->models();
  ASSERT_EQ(models.size(), 1u);
  const Model& m = models[0]->model();
  const auto in_finalize = [&] {
    const RankActivity r0 = m.activity().snapshot()[0];
    return r0.in_call && r0.call == "finalize";
  };
  for (int i = 0; i < 500 && !in_finalize(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(in_finalize()) << "rank 0 did not wait in its finalize for rank 1";

  testing::internal::CaptureStderr();
  srv->stop(SIGTERM);
  const std::string log = testing::internal::GetCapturedStderr();
  finalize.join();

  const std::string broken = m.broken_reason();
  EXPECT_EQ(broken.rfind("the daemon is stopping (signal 15)\nwhere each rank was:\n", 0), 0u) << broken;
  EXPECT_EQ(broken.find("was lost"), std::string::npos) << broken;
  EXPECT_NE(broken.find("  rank 0: in finalize for "), std::string::npos) << broken;
  EXPECT_NE(broken.find("  rank 1: has not created this model (no zd_model_create of it yet)"), std::string::npos)
      << broken;
  EXPECT_EQ(broken.find("never connected"), std::string::npos) << broken;
  EXPECT_EQ(m.broken_code(), ZD_ERR_PEER_LOST);
  if (!replied.empty()) {
    EXPECT_NE(replied.find(broken), std::string::npos) << replied;
  }
  EXPECT_EQ(log.find("zerod[error]"), std::string::npos) << "a stop asked for was logged as an error:\n" << log;
}

// Observers (`zerod status`, `zerod top`) have no deadline once they said
// hello, and each holds a thread: at most max_observers are served at once,
// the next is refused saying so and closed, and ranks are served all along.
namespace {

struct ObserverCap : Fixture {
  void SetUp() override {
    server::ServerOptions o;
    o.world_size = 1;
    o.reclaim_wait_ms = 100;
    o.max_observers = 2;
    srv = std::make_unique<server::Server>(o);
    srv->start();
  }
  // The daemon closed c (nothing more comes but the end of the stream).
  static bool closed(transport::Connection& c) {
    try {
      c.receive(wire::kMaxBody, 5000);
      return false;
    } catch (const Error& e) {
      return e.code() == ZD_ERR_PEER_LOST;
    }
  }
};

}  // namespace

TEST_F(ObserverCap, ObserversPastTheCapAreRefusedAndRanksAreStillServed) {
  std::optional<transport::Connection> first = connect();
  transport::Connection second = connect();
  ASSERT_FALSE(rpc(*first, hello("observer")).has_error());
  ASSERT_FALSE(rpc(second, hello("observer")).has_error());
  transport::Connection third = connect();
  const v1::Reply r = rpc(third, hello("observer"));
  EXPECT_EQ(r.error().status(), ZD_ERR_INVALID_STATE);
  EXPECT_NE(r.error().message().find("serves at most 2 observer connections"), std::string::npos)
      << r.error().message();
  EXPECT_TRUE(closed(third)) << "the refused observer's connection was left open";

  transport::Connection rank = connect();
  ASSERT_FALSE(rpc(rank, hello()).has_error()) << "a rank was refused with the observers at their cap";
  EXPECT_FALSE(rpc(rank, create("return { optimizer = { type = 'sgd' } }"), 2).has_error());

  // An observer that leaves makes room for another (its session ends on its own thread).
  first.reset();
  bool admitted = false;
  for (int i = 0; i < 200 && !admitted; ++i) {
    transport::Connection again = connect();
    admitted = !rpc(again, hello("observer")).has_error();
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(admitted) << "no observer was admitted after one of the two left";
}

// The daemon cannot start a connection's thread (the user's process limit,
// RLIMIT_NPROC, which counts threads): that connection is refused saying
// why, and the daemon serves on. The thread's std::system_error once
// escaped the accept loop and ended the daemon with every job it served.
// The limit binds only a process without CAP_SYS_RESOURCE, so the daemon
// runs in a child that becomes uid 65534, with room for a few threads more
// than it has: needs root (skipped otherwise).
namespace {

constexpr uid_t kNobody = 65534;
constexpr int kChildSkips = 77;

// How many more threads this process may start now (each waits until all
// were counted), up to `most`.
int threads_that_start(int most) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<std::thread> started;
  for (int i = 0; i < most; ++i) {
    try {
      started.emplace_back([&] {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done; });
      });
    } catch (const std::system_error&) {
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  for (auto& t : started) t.join();
  return static_cast<int>(started.size());
}

// Leaves room for exactly `room` more threads under RLIMIT_NPROC; false
// when the limit does not bind here.
bool leave_room_for(int room, std::string* why) {
  for (rlim_t limit = 64; limit <= 8192; limit *= 2) {
    const rlimit lim{limit, limit};
    if (setrlimit(RLIMIT_NPROC, &lim) != 0) {
      *why = std::string("setrlimit(RLIMIT_NPROC): ") + std::strerror(errno);
      return false;
    }
    const int startable = threads_that_start(256);
    if (startable == 256) {
      *why = "RLIMIT_NPROC does not bind threads here";
      return false;
    }
    if (startable == 0) continue;  // uid 65534 has this many tasks already
    const rlim_t tight = limit - static_cast<rlim_t>(startable) + static_cast<rlim_t>(room);
    const rlimit t{tight, tight};
    if (setrlimit(RLIMIT_NPROC, &t) != 0) {
      *why = std::string("setrlimit(RLIMIT_NPROC): ") + std::strerror(errno);
      return false;
    }
    return true;
  }
  *why = "uid 65534 runs thousands of tasks already";
  return false;
}

// The child: a daemon with room for its accept thread and two sessions,
// and clients of its own. Returns 0 when it held, else says what failed.
int daemon_under_a_thread_limit(const std::string& dir, std::string* said) {
  if (setgid(kNobody) != 0 || setuid(kNobody) != 0) {
    *said = std::string("setuid(65534): ") + std::strerror(errno);
    return kChildSkips;
  }
  if (!leave_room_for(3, said)) return kChildSkips;
  server::ServerOptions o;
  o.socket_path = dir + "/zerod.sock";
  o.world_size = 1;
  o.reclaim_wait_ms = 100;
  server::Server srv(o);
  srv.start();
  // An observer's hello: "" if it was served, else what came back (an error, or nothing).
  const auto observe = [&](std::vector<transport::Connection>* held) -> std::string {
    transport::Connection c = transport::connect_unix(srv.socket_path(), 2000);
    try {
      wire::send(c, wire::kRequest, 1, Fixture::hello("observer"));
    } catch (const std::exception&) {
      // The daemon may have closed it already: its reply is still there to read.
    }
    try {
      transport::Frame f = c.receive(wire::kMaxBody, 5000);
      v1::Reply r;
      wire::parse(f, &r, "reply");
      if (!r.has_error()) {
        held->push_back(std::move(c));
        return "";
      }
      return r.error().message();
    } catch (const std::exception& e) {
      return std::string("no reply: ") + e.what();
    }
  };
  std::vector<transport::Connection> held;
  std::string refused;
  for (int i = 0; i < 6; ++i) {
    const std::string got = observe(&held);
    if (!got.empty()) refused = got;
  }
  int failed = 0;
  if (refused.find("the daemon cannot serve another connection now") == std::string::npos) {
    *said += "no connection was refused for want of a thread (" + std::to_string(held.size()) +
             " observers served; the last answer: " + refused + ")\n";
    ++failed;
  }
  held.clear();  // their sessions end, and their threads with them
  std::string got = "not tried";
  for (int i = 0; i < 200 && !got.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    got = observe(&held);
  }
  if (!got.empty()) {
    *said += "the daemon served no observer once the others left: " + got + "\n";
    ++failed;
  }
  held.clear();
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    try {
      transport::Connection rank = transport::connect_unix(srv.socket_path(), 2000);
      wire::send(rank, wire::kRequest, 1, Fixture::hello());
      v1::Reply r;
      wire::parse(rank.receive(wire::kMaxBody, 5000), &r, "reply");
      got = r.has_error() ? r.error().message() : "";
    } catch (const std::exception& e) {
      got = e.what();
    }
    if (got.empty()) break;
  }
  if (!got.empty()) {
    *said += "the daemon served no rank afterwards: " + got + "\n";
    ++failed;
  }
  srv.stop();
  return failed == 0 ? 0 : 1;
}

}  // namespace

TEST(ThreadLimit, AConnectionWhoseThreadCannotStartIsRefusedAndTheDaemonServesOn) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the daemon as uid 65534 under RLIMIT_NPROC";
  char tmpl[] = "/tmp/zerod-thread-limit-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);  // uid 65534 makes its socket there
  const std::string log = dir + "/child.log";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string said;
    int code = 1;
    try {
      code = daemon_under_a_thread_limit(dir, &said);
    } catch (const std::exception& e) {
      said += std::string("the child failed: ") + e.what() + "\n";
    }
    if (FILE* f = std::fopen(log.c_str(), "w")) {
      std::fputs(said.c_str(), f);
      std::fclose(f);
    }
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  std::string said;
  if (FILE* f = std::fopen(log.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) said.append(buf, n);
    std::fclose(f);
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "the child (the daemon) died: status " << status << "\n" << said;
  if (WEXITSTATUS(status) == kChildSkips) GTEST_SKIP() << said;
  EXPECT_EQ(WEXITSTATUS(status), 0) << said;
}
