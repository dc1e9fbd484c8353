#include "trace_json.h"

#include <zerod/zerod.h>

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <locale>

namespace zerod::observe {

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

namespace {

const char* tier_label(int32_t t) {
  switch (t) {
    case ZD_TIER_DEVICE: return "device";
    case ZD_TIER_HOST: return "host";
    case ZD_TIER_NVME: return "nvme";
    default: return "?";
  }
}

class Writer {
 public:
  Writer(std::ostream& out, const TraceFile& f) : out_(out), f_(f), ctx_(*f.context) {}

  void run() {
    // The integers too: a global C++ locale (std::locale::global) would
    // group their thousands.
    const std::locale before = out_.imbue(std::locale::classic());
    out_ << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    metadata();
    for (const TrackEvents& t : f_.tracks)
      for (const TraceEvent& e : t.events) event(t, e);
    out_ << "\n],\n";
    header();
    reports();
    out_ << "}\n";
    out_.imbue(before);
  }

 private:
  void sep() {
    if (!first_) out_ << ",\n";
    first_ = false;
  }

  std::string module_name(int32_t m) const {
    if (m >= 0 && static_cast<size_t>(m) < ctx_.modules.size()) return ctx_.modules[static_cast<size_t>(m)];
    return "#" + std::to_string(m);
  }

  std::string purpose(int64_t tag) const {
    const auto op = static_cast<size_t>(static_cast<uint64_t>(tag) >> 56);
    if (op < ctx_.tag_purposes.size() && !ctx_.tag_purposes[op].empty()) return ctx_.tag_purposes[op];
    return "collective";
  }

  // Numbers through to_chars, which ignores the locale: a trainer that set
  // a comma-decimal one (setlocale) would otherwise write "1,500", which is
  // not JSON.
  static void write_number(std::ostream& o, double v, std::chars_format fmt, int precision) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v, fmt, precision);
    o.write(buf, r.ptr - buf);
  }

  static void ts(std::ostream& o, int64_t ns) {
    write_number(o, static_cast<double>(ns) / 1000.0, std::chars_format::fixed, 3);
  }

  void metadata() {
    for (int r = f_.first_rank; r < f_.first_rank + f_.ranks; ++r) {
      sep();
      out_ << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << r << ",\"tid\":0,\"args\":{\"name\":\"rank " << r
           << "\"}}";
      sep();
      out_ << "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" << r
           << ",\"tid\":0,\"args\":{\"sort_index\":" << r << "}}";
    }
    // A thread's track appears under every rank it recorded for (a shared
    // worker serves several).
    for (const TrackEvents& t : f_.tracks) {
      std::vector<int> pids;
      for (const TraceEvent& e : t.events)
        if (std::find(pids.begin(), pids.end(), e.rank) == pids.end()) pids.push_back(e.rank);
      for (int pid : pids) {
        sep();
        out_ << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << pid << ",\"tid\":" << t.track
             << ",\"args\":{\"name\":\"" << json_escape(t.name) << "\"}}";
        sep();
        out_ << "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" << pid << ",\"tid\":" << t.track
             << ",\"args\":{\"sort_index\":" << t.track << "}}";
      }
    }
  }

  // The display name: the static name, with what the numbers say.
  std::string display_name(const TraceEvent& e) const {
    std::string n = e.name;
    if (std::string(e.cat) == "step") return "step " + std::to_string(e.step);
    if (std::string(e.cat) == "comm" && e.args.value != 0 && n != "wait for rank") return n + " (" + purpose(e.args.value) + ")";
    if (e.args.module >= 0) n += " " + module_name(e.args.module);
    if (n == "wait for rank" && e.args.peer >= 0) n += " " + std::to_string(e.args.peer);
    if (e.args.tier >= 0 && std::string(e.cat) == "optimizer") n += std::string(" (") + tier_label(e.args.tier) + ")";
    return n;
  }

  void args(const TraceEvent& e) {
    out_ << ",\"args\":{\"step\":" << e.step << ",\"op\":\"" << json_escape(e.name) << "\"";
    const EventArgs& a = e.args;
    if (a.module >= 0) out_ << ",\"module\":\"" << json_escape(module_name(a.module)) << "\"";
    if (a.bytes) out_ << ",\"bytes\":" << a.bytes;
    if (a.tier >= 0) out_ << ",\"tier\":\"" << tier_label(a.tier) << "\"";
    if (a.peer >= 0) out_ << ",\"late_rank\":" << a.peer;
    if (a.flags & kFlagPrefetched) out_ << ",\"prefetched\":true";
    if (std::string(e.cat) == "comm") {
      if (a.value) out_ << ",\"purpose\":\"" << json_escape(purpose(a.value)) << "\"";
      if (a.value2) {
        out_ << ",\"waited_us\":";
        ts(out_, a.value2);
      }
    } else if (std::string(e.cat) == "nvme" || std::string(e.cat) == "copy") {
      out_ << ",\"direction\":\"" << ((a.flags & kFlagWrite) ? "write" : "read") << "\"";
    } else if (a.value) {
      out_ << ",\"value\":" << a.value;
    }
    out_ << "}";
  }

  void event(const TrackEvents& t, const TraceEvent& e) {
    const std::string name = json_escape(display_name(e));
    switch (e.kind) {
      case EventKind::Span:
        sep();
        out_ << "{\"ph\":\"X\",\"name\":\"" << name << "\",\"cat\":\"" << e.cat << "\",\"pid\":" << e.rank
             << ",\"tid\":" << t.track << ",\"ts\":";
        ts(out_, e.ts_ns);
        out_ << ",\"dur\":";
        ts(out_, e.dur_ns);
        args(e);
        out_ << "}";
        break;
      case EventKind::Async: {
        const uint64_t id = ++async_id_;
        for (int half = 0; half < 2; ++half) {
          sep();
          out_ << "{\"ph\":\"" << (half ? 'e' : 'b') << "\",\"name\":\"" << name << "\",\"cat\":\"" << e.cat
               << "\",\"id\":\"0x" << std::hex << id << std::dec << "\",\"pid\":" << e.rank
               << ",\"tid\":" << t.track << ",\"ts\":";
          ts(out_, half ? e.ts_ns + e.dur_ns : e.ts_ns);
          if (!half) args(e);
          out_ << "}";
        }
        break;
      }
      case EventKind::Instant:
        sep();
        out_ << "{\"ph\":\"i\",\"s\":\"t\",\"name\":\"" << name << "\",\"cat\":\"" << e.cat
             << "\",\"pid\":" << e.rank << ",\"tid\":" << t.track << ",\"ts\":";
        ts(out_, e.ts_ns);
        args(e);
        out_ << "}";
        break;
      case EventKind::Counter:
        sep();
        out_ << "{\"ph\":\"C\",\"name\":\"" << e.name << "\",\"cat\":\"" << e.cat << "\",\"pid\":" << e.rank
             << ",\"tid\":" << t.track << ",\"ts\":";
        ts(out_, e.ts_ns);
        if (std::string(e.cat) == "memory")
          out_ << ",\"args\":{\"device\":" << e.args.value << ",\"host\":" << e.args.value2
               << ",\"nvme\":" << e.args.value3 << "}}";
        else
          out_ << ",\"args\":{\"" << e.name << "\":" << e.args.value << "}}";
        break;
    }
  }

  void header() {
    uint64_t dropped = 0;
    for (const TrackEvents& t : f_.tracks) dropped += t.dropped;
    out_ << "\"zerodTrace\":{\"job\":\"" << json_escape(ctx_.job) << "\",\"steps\":[" << f_.settings->from << ","
         << f_.settings->to << "],\"ranks\":[" << f_.first_rank << "," << (f_.first_rank + f_.ranks - 1)
         << "],\"world_size\":" << ctx_.world_size << ",\"zero_stage\":" << ctx_.zero_stage
         << ",\"events_per_thread\":" << f_.settings->events_per_thread << ",\"dropped_events\":" << dropped
         << ",\"reports_dropped\":" << f_.reports_dropped << ",\"modules\":[";
    for (size_t i = 0; i < ctx_.modules.size(); ++i)
      out_ << (i ? "," : "") << "\"" << json_escape(ctx_.modules[i]) << "\"";
    out_ << "]},\n";
  }

  // Every report of the run (the loss curve), outside traceEvents so the
  // timeline keeps to the recorded steps.
  void reports() {
    out_ << "\"zerodReports\":[";
    bool first = true;
    for (const Report& r : f_.reports) {
      out_ << (first ? "\n" : ",\n");
      first = false;
      out_ << "{\"rank\":" << r.rank << ",\"step\":" << r.step << ",\"ts\":";
      ts(out_, r.ts_ns - f_.epoch_ns);
      out_ << ",\"tokens\":" << r.tokens << ",\"samples\":" << r.samples;
      if (r.has_loss) {
        out_ << ",\"loss\":";
        // JSON has no NaN or infinity: a diverged loss is written as null.
        if (std::isfinite(r.loss))
          write_number(out_, r.loss, std::chars_format::general, 9);
        else
          out_ << "null";
      }
      out_ << "}";
    }
    out_ << "]\n";
  }

  std::ostream& out_;
  const TraceFile& f_;
  const TraceContext& ctx_;
  bool first_ = true;
  uint64_t async_id_ = 0;
};

}  // namespace

void write_chrome_trace(std::ostream& out, const TraceFile& f) { Writer(out, f).run(); }

}  // namespace zerod::observe
