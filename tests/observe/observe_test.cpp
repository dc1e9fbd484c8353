// The observing parts on their own: the per-thread rings, the tracer's step
// window and file, the counters and their histogram, the board that names
// the rank a collective waited for, listen addresses, and the reading of
// the daemon's Prometheus text by `zerod top`. The threaded cases are what
// the tsan preset runs: rings written by several threads while the writer
// copies them, counters read while ranks add to them.
#include "observe/clock.h"
#include "observe/collective_board.h"
#include "observe/listen_address.h"
#include "observe/probe.h"
#include "observe/rank_counters.h"
#include "observe/trace_json.h"
#include "observe/trace_ring.h"
#include "observe/tracer.h"
#include "top/prom_text.h"
#include "top/top_view.h"

#include "../harness/comma_locale.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace zerod::observe {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string temp_dir() {
  char tmpl[] = "/tmp/zerod-observe-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TraceEvent span(int64_t ts, const char* name) {
  TraceEvent e;
  e.ts_ns = ts;
  e.dur_ns = 1;
  e.name = name;
  e.cat = "call";
  return e;
}

TEST(TraceRing, KeepsTheNewestEventsInOrderAndCountsTheOverwritten) {
  TraceRing ring(4, 1, "calls");
  for (int i = 0; i < 10; ++i) ring.push(span(i, "e"));
  const auto ev = ring.snapshot();
  ASSERT_EQ(ev.size(), 4u);
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i].ts_ns, static_cast<int64_t>(6 + i));
  EXPECT_EQ(ring.dropped(), 6u);
}

TEST(Tracer, RecordsOnlyInsideTheStepWindowAndWritesWhenEveryRankIsPastIt) {
  const std::string dir = temp_dir();
  TraceSettings s;
  s.path = dir + "/sub/trace.json";  // the folder is made
  s.from = 2;
  s.to = 3;
  auto t = std::make_unique<Tracer>(s, 0, 2);
  for (int step = 1; step <= 4; ++step) {
    for (int r = 0; r < 2; ++r) {
      t->step_started(r, step);
      EXPECT_EQ(t->recording(r), step >= 2 && step <= 3) << "step " << step;
      if (t->recording(r)) {
        TraceEvent e = span(step * 100 + r, "forward_begin");
        e.rank = r;
        e.step = step;
        t->record(e);
      }
      t->step_finished(r, step);
      EXPECT_FALSE(t->recording(r)) << "nothing is recorded between steps";
    }
    // Written as soon as both ranks finished step 3, not before.
    EXPECT_EQ(access(s.path.c_str(), F_OK) == 0, step >= 3) << "step " << step;
  }
  const std::string json = read_file(s.path);
  EXPECT_EQ(count(json, "\"ph\":\"X\""), 4u) << json;
  EXPECT_NE(json.find("\"process_name\",\"pid\":1"), std::string::npos);
  EXPECT_NE(json.find("\"zerodTrace\""), std::string::npos);
  EXPECT_NE(json.find("\"steps\":[2,3]"), std::string::npos);
}

// Where the trace is asked for, its path is tried: the folder is made, a
// file is created in it and removed; a path that cannot be written says
// why (here a folder that is a device file).
TEST(Tracer, APathIsTriedBeforeTheRunAndLeavesNothingBehind) {
  const std::string dir = temp_dir();
  EXPECT_EQ(trace_path_problem(dir + "/made/trace.json"), "");
  EXPECT_EQ(access((dir + "/made").c_str(), F_OK), 0) << "the folder is made";
  EXPECT_EQ(rmdir((dir + "/made").c_str()), 0) << "and nothing is left in it";
  const std::string why = trace_path_problem("/dev/null/trace.json");
  EXPECT_NE(why.find("cannot create a file in /dev/null"), std::string::npos) << why;
  EXPECT_NE(trace_path_problem(""), "");
}

// A model that never began a step (zerod.torch's broadcast of initial
// values under `zerod run --trace`) warns of nothing; one that stepped
// outside the window says its trace was not written.
TEST(Tracer, OnlyAModelThatSteppedWarnsThatNoStepWasRecorded) {
  const std::string dir = temp_dir();
  TraceSettings s;
  s.path = dir + "/trace.json";
  s.from = 5;
  s.to = 6;
  testing::internal::CaptureStderr();
  { Tracer never(s, 0, 1); }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  {
    Tracer early(s, 0, 1);
    early.step_started(0, 1);
    early.step_finished(0, 1);
  }
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("no step in trace.steps {5, 6} ran"), std::string::npos) << said;
  EXPECT_NE(access(s.path.c_str(), F_OK), 0);
}

// A run resumed past its window (a snapshot resume, a load) records no step
// of it: the trace an earlier run wrote at that path stays, neither
// replaced at the window's end nor when the model goes, reports or not.
TEST(Tracer, ARunResumedPastTheWindowKeepsTheEarlierRunsTrace) {
  const std::string dir = temp_dir();
  TraceSettings s;
  s.path = dir + "/trace.json";
  s.from = 2;
  s.to = 3;
  {
    std::ofstream earlier(s.path);
    earlier << "the earlier run's trace";
  }
  testing::internal::CaptureStderr();
  {
    Tracer resumed(s, 0, 1);
    for (int64_t step = 11; step <= 12; ++step) {
      resumed.step_started(0, step);
      EXPECT_FALSE(resumed.recording(0));
      Report r;
      r.step = step;
      r.has_loss = true;
      resumed.report(r);
      resumed.step_finished(0, step);
      EXPECT_EQ(read_file(s.path), "the earlier run's trace") << "after step " << step;
    }
  }
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(read_file(s.path), "the earlier run's trace");
  EXPECT_NE(said.find("a trace an earlier run wrote there is kept"), std::string::npos) << said;
}

// A run stopped before its window (trace.steps {1000, 1010}, stopped at
// step 2) still writes its losses at the end: `zerod plot` draws them.
TEST(Tracer, ARunStoppedBeforeTheWindowWritesItsReports) {
  const std::string dir = temp_dir();
  TraceSettings s;
  s.path = dir + "/trace.json";
  s.from = 5;
  s.to = 6;
  {
    Tracer t(s, 0, 1);
    for (int64_t step = 1; step <= 2; ++step) {
      t.step_started(0, step);
      Report r;
      r.step = step;
      r.has_loss = true;
      t.report(r);
      t.step_finished(0, step);
    }
    EXPECT_EQ(access(s.path.c_str(), F_OK), -1) << "written before the end";
  }
  EXPECT_NE(read_file(s.path).find("zerodReports"), std::string::npos) << read_file(s.path);
}

TEST(Tracer, OneDaemonOfSeveralNamesItsRanksInTheFile) {
  const std::string dir = temp_dir();
  TraceSettings s;
  s.path = dir + "/trace.json";
  s.from = s.to = 1;
  Tracer t(s, 2, 2);
  TraceContext ctx;
  ctx.world_size = 4;
  t.set_context(ctx);
  t.step_started(2, 1);
  t.record(span(1, "x"));
  ASSERT_TRUE(t.write());
  EXPECT_EQ(access((dir + "/trace.ranks2-3.json").c_str(), F_OK), 0);
}

TEST(Tracer, RingsOfManyThreadsWhileTheFileIsWritten) {
  const std::string dir = temp_dir();
  TraceSettings s;
  s.path = dir + "/trace.json";
  s.from = 1;
  s.to = 1000000;
  s.events_per_thread = 1024;
  Tracer t(s, 0, 4);
  for (int r = 0; r < 4; ++r) t.step_started(r, 1);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      set_thread_role(r % 2 ? "collectives" : "calls");
      for (int i = 0; i < 5000; ++i) {
        TraceEvent e = span(i, "all_gather");
        e.rank = r;
        t.record(e);
      }
    });
  std::thread writer([&] {
    while (!stop.load()) t.write();
  });
  for (auto& th : threads) th.join();
  stop = true;
  writer.join();
  ASSERT_TRUE(t.write());
  const std::string json = read_file(s.path);
  EXPECT_EQ(count(json, "\"ph\":\"X\""), 4u * 1024u) << "each ring keeps its newest 1024";
  EXPECT_NE(json.find("\"dropped_events\":" + std::to_string(4 * (5000 - 1024))), std::string::npos);
}

// fp16's loss scaler skips an update (an overflow): the step goes on to the
// boundary that applies it, one "step 1" span (several failed `zerod plot
// --check`), and only applied updates count in zerod_steps_total. A load or
// resume (restart) moves the step the trace names, not that counter.
TEST(RankProbe, ASkippedUpdateKeepsTheStepOpenAndALoadMovesTheStep) {
  const std::string dir = temp_dir();
  TraceSettings s;
  s.path = dir + "/trace.json";
  s.from = 1;
  s.to = 12;
  {
    Tracer t(s, 0, 1);
    RankProbe p(0);
    p.attach(&t, 0, 1);
    EXPECT_NE(p.call_entered(), 0) << "the first call opens step 1";
    p.boundary(0, now_ns());  // skipped: nothing applied
    EXPECT_EQ(p.step(), 1);
    EXPECT_EQ(p.call_entered(), 0) << "step 1 is still open";
    p.boundary(1, now_ns());
    EXPECT_EQ(p.step(), 2);
    EXPECT_EQ(p.counters().steps_applied.load(), 1u);
    p.restart(10);  // zd_model_load of step 10
    EXPECT_EQ(p.step(), 11);
    EXPECT_NE(p.call_entered(), 0);
    p.boundary(11, now_ns());
    EXPECT_EQ(p.counters().steps_applied.load(), 2u) << "a counter: the load added nothing";
  }
  const std::string json = read_file(s.path);
  EXPECT_EQ(count(json, "\"name\":\"step 1\""), 1u) << json;
  EXPECT_EQ(count(json, "\"name\":\"step 11\""), 1u) << json;
  EXPECT_EQ(count(json, "\"cat\":\"step\""), 2u) << json;
}

TEST(TraceJson, EscapesNamesAndWritesAsyncSpansAsPairs) {
  EXPECT_EQ(json_escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
  TraceSettings s;
  TraceContext ctx;
  ctx.modules = {"blk\"0"};
  TraceFile f;
  f.settings = &s;
  f.context = &ctx;
  TrackEvents tr;
  tr.track = 1;
  tr.name = "calls";
  TraceEvent e = span(1000, "forward");
  e.kind = EventKind::Async;
  e.cat = "module";
  e.dur_ns = 5000;
  e.args.module = 0;
  tr.events.push_back(e);
  f.tracks.push_back(tr);
  Report rep;
  rep.loss = std::nan("");
  rep.has_loss = true;
  f.reports.push_back(rep);
  std::ostringstream out;
  write_chrome_trace(out, f);
  const std::string json = out.str();
  EXPECT_NE(json.find("{\"ph\":\"b\",\"name\":\"forward blk\\\"0\""), std::string::npos) << json;
  EXPECT_NE(json.find("{\"ph\":\"e\",\"name\":\"forward blk\\\"0\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"ts\":6.000"), std::string::npos) << "the end is 5 us after the begin: " << json;
  EXPECT_NE(json.find("\"loss\":null"), std::string::npos) << "JSON has no NaN: " << json;
}

// A trainer that set a comma-decimal locale (setlocale, std::locale::global)
// before its model wrote the trace: the file is the one the "C" locale
// gives, valid JSON ("ts":1.500, not 1,500; step 1234, not 1.234).
TEST(TraceJson, TheProcesssLocaleChangesNoNumber) {
  TraceSettings s;
  TraceContext ctx;
  TraceFile f;
  f.settings = &s;
  f.context = &ctx;
  TrackEvents tr;
  tr.track = 1;
  tr.name = "calls";
  TraceEvent e = span(1500, "forward_begin");
  e.step = 1234;
  e.dur_ns = 2250;
  tr.events.push_back(e);
  f.tracks.push_back(tr);
  Report rep;
  rep.step = 1234;
  rep.ts_ns = 1500;
  rep.tokens = 123456;
  rep.loss = 0.25;
  rep.has_loss = true;
  f.reports.push_back(rep);
  const auto written = [&] {
    std::ostringstream out;
    write_chrome_trace(out, f);
    return out.str();
  };
  const std::string in_c = written();
  EXPECT_NE(in_c.find("\"ts\":1.500,\"dur\":2.250"), std::string::npos) << in_c;
  EXPECT_NE(in_c.find("\"loss\":0.25}"), std::string::npos) << in_c;
  const zerod_test::CommaLocale comma;
  if (!comma.available()) GTEST_SKIP() << comma.why_not();
  EXPECT_EQ(written(), in_c);
}

TEST(Histogram, CountsIntoCumulativeBuckets) {
  Histogram h;
  h.observe(0.0005);
  h.observe(0.003);
  h.observe(0.003);
  h.observe(1000);
  const auto s = h.snapshot();
  EXPECT_EQ(s.cumulative[0], 1u);  // <= 1 ms
  EXPECT_EQ(s.cumulative[2], 3u);  // <= 5 ms
  EXPECT_EQ(s.cumulative.back(), 3u);
  EXPECT_EQ(s.count, 4u);
  EXPECT_NEAR(s.sum, 1000.0065, 1e-6);
}

TEST(RateWindow, PerSecondOverTheRecentReportsAndZeroWhenStale) {
  RateWindow w;
  const int64_t s = 1'000'000'000;
  EXPECT_EQ(w.rate(0), 0);
  for (int i = 0; i <= 10; ++i) w.add(i * s, static_cast<uint64_t>(i) * 500);
  EXPECT_NEAR(w.rate(10 * s), 500.0, 1e-9);
  EXPECT_EQ(w.rate(25 * s), 0) << "a trainer that stopped reporting is not running at its last rate";
}

TEST(CollectiveBoard, NamesTheLastRankToArriveAndHowLongTheOthersWaited) {
  CollectiveBoard board(0, 3);
  std::vector<std::unique_ptr<RankProbe>> probes;
  for (int r = 0; r < 3; ++r) {
    probes.push_back(std::make_unique<RankProbe>(r));
    probes.back()->attach(nullptr, 0, 3);
    board.bind(r, probes.back().get());
  }
  // Rank 2 arrives 20 ms after both others have arrived, at every one of 5
  // collectives. It waits for their arrival first, so a loaded machine that
  // runs rank 0 or 1 late cannot shorten the wait the board must see.
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      for (int k = 0; k < 5; ++k) {
        if (r == 2) {
          while (board.arrivals(0) <= static_cast<uint64_t>(k) || board.arrivals(1) <= static_cast<uint64_t>(k))
            std::this_thread::yield();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        const auto a = board.arrive(r);
        // Stands in for the plugin's rendezvous: nobody leaves before all came.
        while (true) {
          bool all = true;
          for (int j = 0; j < 3; ++j) all = all && board.arrivals(j) > static_cast<uint64_t>(k);
          if (all) break;
          std::this_thread::yield();
        }
        board.complete(r, a, "all_reduce", 0, 64);
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    const RankCounters& c = probes[static_cast<size_t>(r)]->counters();
    EXPECT_EQ(c.late_count[2].load(), 5u) << "rank " << r;
    EXPECT_GE(c.peer_wait_by_late[2].load(), 5 * 20'000'000) << "rank " << r;
    EXPECT_EQ(c.late_count[1 - r].load(), 0u);
  }
  EXPECT_LT(probes[2]->counters().peer_wait_ns.load(), 5 * 5'000'000) << "the late rank waits for nobody";
}

TEST(RankCounters, ReadWhileRanksAddToThem) {
  RankProbe p(0);
  p.attach(nullptr, 0, 2);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    double last = 0;
    while (!stop.load()) {
      const auto h = p.counters().step_seconds.snapshot();
      EXPECT_GE(static_cast<double>(h.count), last);
      last = static_cast<double>(h.count);
      (void)p.counters().tokens_rate.rate(now_ns());
      (void)p.counters().loss();
    }
  });
  for (int i = 1; i <= 2000; ++i) {
    p.call_entered();
    p.boundary(i, now_ns());
    p.report(128, 2, true, 1.0 / i, i);
  }
  stop = true;
  reader.join();
  EXPECT_EQ(p.counters().tokens.load(), 2000u * 128u);
  EXPECT_EQ(p.counters().step_seconds.snapshot().count, 2000u);
  EXPECT_DOUBLE_EQ(p.counters().loss(), 1.0 / 2000);
  EXPECT_EQ(p.step(), 2001);
}

TEST(ListenAddress, TcpUnixAndMistakes) {
  std::string why;
  auto a = parse_listen_address("127.0.0.1:9400", &why);
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->unix_socket);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9400);
  a = parse_listen_address("[::1]:0", &why);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "::1");
  a = parse_listen_address("unix:/run/m.sock", &why);
  ASSERT_TRUE(a && a->unix_socket);
  EXPECT_EQ(a->path, "/run/m.sock");
  EXPECT_TRUE(parse_listen_address("/tmp/m.sock", &why));
  EXPECT_FALSE(parse_listen_address("9400", &why));
  EXPECT_NE(why.find("host:port"), std::string::npos);
  EXPECT_FALSE(parse_listen_address("localhost:99999", &why));
  EXPECT_NE(why.find("0 to 65535"), std::string::npos);
  EXPECT_FALSE(parse_listen_address("::1:9400", &why));
  EXPECT_NE(why.find("brackets"), std::string::npos);
  // Digits only: strtol took a space or a sign before them.
  for (const char* text : {"127.0.0.1: 9401", "127.0.0.1:+9401", "127.0.0.1:-0", "127.0.0.1:9401 ", "127.0.0.1:0x10",
                           "127.0.0.1:99999999999999999999"}) {
    why.clear();
    EXPECT_FALSE(parse_listen_address(text, &why)) << text;
    EXPECT_NE(why.find("0 to 65535"), std::string::npos) << text << ": " << why;
  }
  a = parse_listen_address("127.0.0.1:65535", &why);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->port, 65535);
  a = parse_listen_address("127.0.0.1:00080", &why);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->port, 80);
}

}  // namespace
}  // namespace zerod::observe

namespace zerod::top {
namespace {

TEST(PromText, ReadsLabelsValuesAndSpecialNumbers) {
  const auto s = parse_prometheus(
      "# HELP x y\n# TYPE x gauge\nzerod_loss{model=\"0\",rank=\"1\"} 1.5\nzerod_up 1\n"
      "zerod_x{job=\"a \\\"b\\\"\"} NaN\nbad line\n");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].name, "zerod_loss");
  EXPECT_EQ(s[0].labels.at("rank"), "1");
  EXPECT_EQ(s[0].value, 1.5);
  EXPECT_EQ(s[1].name, "zerod_up");
  EXPECT_EQ(s[2].labels.at("job"), "a \"b\"");
  EXPECT_TRUE(std::isnan(s[2].value));
}

TEST(TopView, RatesFromTwoFramesAndTheLateRank) {
  v1::StatusReply st;
  st.set_pid(42);
  st.set_world_size(2);
  auto* m = st.add_models();
  m->set_job("job.lua");
  m->set_zero_stage(3);
  m->set_numel(4547);
  m->set_finalized(true);
  for (int r = 0; r < 2; ++r) {
    auto* rs = m->add_ranks();
    rs->set_rank(r);
    rs->set_step(10);
    rs->set_state("in step for 0.1 s");
  }
  auto metrics = [](double steps, double wait) {
    std::string t;
    for (int r = 0; r < 2; ++r) {
      const std::string l = "{model=\"0\",rank=\"" + std::to_string(r) + "\"";
      t += "zerod_steps_total" + l + "} " + std::to_string(steps) + "\n";
      t += "zerod_tokens_per_second" + l + "} 2500\n";
      t += "zerod_loss" + l + "} 2.25\n";
      t += "zerod_memory_bytes" + l + ",tier=\"host\",kind=\"master\"} 1048576\n";
      t += "zerod_memory_budget_bytes" + l + ",tier=\"host\"} 4194304\n";
      t += "zerod_peer_wait_seconds_total" + l + "} " + std::to_string(wait) + "\n";
      t += "zerod_update_wait_seconds_total" + l + "} " + std::to_string(wait / 5) + "\n";
      t += "zerod_peer_wait_by_rank_seconds_total" + l + ",late_rank=\"" + std::to_string(1 - r) + "\"} " +
           std::to_string(wait) + "\n";
    }
    return t;
  };
  st.set_metrics(metrics(10, 0));
  const Snapshot a = snapshot(st, 100.0);
  st.set_metrics(metrics(30, 0.5));
  const Snapshot b = snapshot(st, 102.0);
  const std::string frame = render_frame(st, b, &a, 160);
  EXPECT_NE(frame.find(", 4547 elements\n"), std::string::npos) << "an element count, not a tensor count: " << frame;
  EXPECT_NE(frame.find("10.0"), std::string::npos) << "20 steps in 2 s: " << frame;
  EXPECT_NE(frame.find("2.5k"), std::string::npos) << frame;
  EXPECT_NE(frame.find("2.25"), std::string::npos) << frame;
  EXPECT_NE(frame.find("[#####...............]"), std::string::npos) << "1 MiB of a 4 MiB budget: " << frame;
  EXPECT_NE(frame.find("peers 25.0% (rank 1 late)"), std::string::npos) << "0.5 s of 2 s: " << frame;
  EXPECT_NE(frame.find("update wait  5.0%"), std::string::npos) << "0.1 s of 2 s behind the overlapped update: " << frame;
  for (size_t at = 0, nl; (nl = frame.find('\n', at)) != std::string::npos; at = nl + 1)
    EXPECT_LE(nl - at, 160u) << "a line wider than the terminal";
}

}  // namespace
}  // namespace zerod::top
