#include "tracer.h"

#include "clock.h"
#include "trace_json.h"

#include "log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace zerod::observe {

namespace {

thread_local const char* tls_role = nullptr;

// The calling thread's ring of the tracer it used last: most threads record
// for one model, so the lookup under the tracer's lock happens once.
struct RingCache {
  uint64_t tracer = 0;
  TraceRing* ring = nullptr;
};
thread_local RingCache tls_ring;

std::atomic<uint64_t> next_tracer_id{1};

constexpr size_t kMaxReports = size_t{1} << 20;  // about 48 MiB at most

// mkdir -p of the file's folder; errors surface when the file is opened.
void make_parent(const std::string& path) {
  for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
    ::mkdir(path.substr(0, at).c_str(), 0777);
}

}  // namespace

std::string trace_path_problem(const std::string& path) {
  if (path.empty()) return "the path is empty";
  make_parent(path);
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  // Named per call too: two models created at once in one daemon try theirs.
  static std::atomic<uint64_t> probes{0};
  const std::string probe =
      dir + "/.zerod-trace-probe." + std::to_string(::getpid()) + "." + std::to_string(probes.fetch_add(1));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create a file in " + dir + ": " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

void set_thread_role(const char* role) { tls_role = role; }
const char* thread_role() { return tls_role ? tls_role : "calls"; }

Tracer::Tracer(TraceSettings settings, int first_rank, int ranks)
    : settings_(std::move(settings)),
      first_(first_rank),
      ranks_(ranks),
      epoch_ns_(now_ns()),
      id_(next_tracer_id.fetch_add(1)),
      recording_(new std::atomic<bool>[static_cast<size_t>(ranks)]),
      finished_(static_cast<size_t>(ranks), false) {
  for (int i = 0; i < ranks; ++i) recording_[static_cast<size_t>(i)].store(false);
}

Tracer::~Tracer() {
  // Written again at the end (with every loss reported since) even after a
  // failed write: the disk may have room now.
  if (worth_writing())
    write();
  else if (stepped_.load(std::memory_order_relaxed))
    // A model that never began a step (zerod.torch's broadcast of the
    // initial values, one only saved or loaded) had nothing to record: a
    // warning would read as a trace lost.
    log_warn("trace: no step in trace.steps {" + std::to_string(settings_.from) + ", " +
             std::to_string(settings_.to) + "} ran; " + settings_.path +
             " was not written (a trace an earlier run wrote there is kept)");
}

bool Tracer::traced() const {
  // A ring is made by the first event a thread records, and events are
  // recorded only inside the window.
  std::lock_guard<std::mutex> lock(mu_);
  return !rings_.empty();
}

bool Tracer::worth_writing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !rings_.empty() || (began_before_window_.load(std::memory_order_relaxed) && !reports_.empty());
}

void Tracer::set_context(TraceContext ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = std::move(ctx);
}

TraceRing& Tracer::ring_of_this_thread() {
  if (tls_ring.tracer == id_) return *tls_ring.ring;
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = rings_[std::this_thread::get_id()];
  if (!slot) slot = std::make_shared<TraceRing>(settings_.events_per_thread, static_cast<int>(rings_.size()),
                                                thread_role());
  tls_ring = {id_, slot.get()};
  return *slot;
}

void Tracer::record(const TraceEvent& e) { ring_of_this_thread().push(e); }

void Tracer::report(const Report& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reports_.size() >= kMaxReports) {
    ++reports_dropped_;
    return;
  }
  reports_.push_back(r);
}

void Tracer::step_started(int rank, int64_t step) {
  const int i = rank - first_;
  if (i < 0 || i >= ranks_) return;
  stepped_.store(true, std::memory_order_relaxed);
  if (step < settings_.from) began_before_window_.store(true, std::memory_order_relaxed);
  recording_[static_cast<size_t>(i)].store(step >= settings_.from && step <= settings_.to,
                                           std::memory_order_relaxed);
}

void Tracer::step_finished(int rank, int64_t step) {
  const int i = rank - first_;
  if (i < 0 || i >= ranks_) return;
  // Between steps nothing is recorded: every event lies inside its step.
  recording_[static_cast<size_t>(i)].store(false, std::memory_order_relaxed);
  if (step < settings_.to) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_[static_cast<size_t>(i)] = true;
    if (window_written_ || std::count(finished_.begin(), finished_.end(), false) > 0) return;
    window_written_ = true;
    // A window no step of which ran here (a run resumed past it) has nothing
    // to write: an empty file would replace the trace the earlier run wrote.
    if (rings_.empty()) return;
  }
  write();
}

uint64_t Tracer::events_recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [tid, ring] : rings_) n += ring->snapshot().size();
  return n;
}

bool Tracer::write() {
  TraceFile f;
  TraceContext ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctx = ctx_;
    f.reports = reports_;
    f.reports_dropped = reports_dropped_;
    for (const auto& [tid, ring] : rings_) {
      TrackEvents t;
      t.track = ring->track();
      t.name = ring->name();
      t.events = ring->snapshot();
      t.dropped = ring->dropped();
      f.tracks.push_back(std::move(t));
    }
  }
  std::sort(f.tracks.begin(), f.tracks.end(), [](const TrackEvents& a, const TrackEvents& b) { return a.track < b.track; });
  f.settings = &settings_;
  f.context = &ctx;
  f.first_rank = first_;
  f.ranks = ranks_;
  f.epoch_ns = epoch_ns_;

  std::string path = settings_.path;
  if (ctx.world_size > ranks_) {
    // One daemon per node: each writes its own ranks' file.
    const std::string tag = ".ranks" + std::to_string(first_) + "-" + std::to_string(first_ + ranks_ - 1);
    const auto dot = path.rfind('.');
    const auto slash = path.rfind('/');
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash))
      path.insert(dot, tag);
    else
      path += tag;
  }
  make_parent(path);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      log_warn("trace: cannot write " + tmp + ": " + std::strerror(errno) + "; the trace is lost");
      return false;
    }
    write_chrome_trace(out, f);
    out.flush();
    if (!out) {
      log_warn("trace: writing " + tmp + " failed: " + std::strerror(errno) + "; the trace is lost");
      ::unlink(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    log_warn("trace: cannot rename " + tmp + " to " + path + ": " + std::strerror(errno) + "; the trace is lost");
    ::unlink(tmp.c_str());
    return false;
  }
  uint64_t events = 0, dropped = 0;
  for (const TrackEvents& t : f.tracks) {
    events += t.events.size();
    dropped += t.dropped;
  }
  log_info("trace: steps " + std::to_string(settings_.from) + "-" + std::to_string(settings_.to) + " of ranks " +
           std::to_string(first_) + "-" + std::to_string(first_ + ranks_ - 1) + " written to " + path + " (" +
           std::to_string(events) + " events on " + std::to_string(f.tracks.size()) + " threads" +
           (dropped ? ", " + std::to_string(dropped) + " older ones overwritten: raise trace.events_per_thread"
                    : std::string()) +
           ")");
  if (dropped)
    log_warn("trace: " + std::to_string(dropped) + " events were overwritten (trace.events_per_thread = " +
             std::to_string(settings_.events_per_thread) + "); the file holds the latest ones");
  return true;
}

}  // namespace zerod::observe
