#include "top_view.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace zerod::top {

namespace {

const char* const kTiers[] = {"device", "host", "nvme"};

// The metric's name with its labels other than model and rank: the key a
// rank's figures are kept under.
std::string key_of(const Sample& s) {
  std::string k = s.name;
  bool first = true;
  for (const auto& [name, value] : s.labels) {
    if (name == "model" || name == "rank") continue;
    k += (first ? "{" : ",") + name + "=" + value;
    first = false;
  }
  return first ? k : k + "}";
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string human_rate(double per_s) {
  char buf[32];
  if (per_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", per_s / 1e6);
  else if (per_s >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f", per_s);
  return buf;
}

std::string bar(double fill, int width) {
  fill = std::clamp(fill, 0.0, 1.0);
  const int n = static_cast<int>(std::lround(fill * width));
  return "[" + std::string(static_cast<size_t>(n), '#') + std::string(static_cast<size_t>(width - n), '.') + "]";
}

class Frame {
 public:
  explicit Frame(int width) : width_(std::max(width, 40)) {}
  void line(const std::string& s) { out_ += s.size() > static_cast<size_t>(width_) ? s.substr(0, static_cast<size_t>(width_)) + "\n" : s + "\n"; }
  void linef(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    line(buf);
  }
  std::string text() const { return out_; }

 private:
  int width_;
  std::string out_;
};

double get(const std::map<std::string, double>& m, const std::string& k, double fallback = 0) {
  const auto it = m.find(k);
  return it == m.end() ? fallback : it->second;
}

}  // namespace

Snapshot snapshot(const v1::StatusReply& status, double t) {
  Snapshot s;
  s.t = t;
  for (const Sample& x : parse_prometheus(status.metrics())) {
    const auto m = x.labels.find("model");
    const auto r = x.labels.find("rank");
    if (m == x.labels.end() || r == x.labels.end()) continue;
    s.ranks[{std::atoi(m->second.c_str()), std::atoi(r->second.c_str())}][key_of(x)] = x.value;
  }
  return s;
}

std::string render_frame(const v1::StatusReply& st, const Snapshot& now, const Snapshot* before, int width) {
  Frame f(width);
  f.linef("zerod top: daemon pid %d, up %.0f s, %d rank%s, %s   (q quits)", st.pid(), st.uptime_s(), st.world_size(),
          st.world_size() == 1 ? "" : "s", st.socket().c_str());
  const double dt = before ? now.t - before->t : 0;
  if (st.models().empty()) {
    f.line("");
    f.line("no models yet: waiting for ranks to create one");
  }
  for (const auto& m : st.models()) {
    f.line("");
    f.linef("model %d: %s, ZeRO stage %d, %s, %lld elements%s", m.model(), m.job().c_str(), m.zero_stage(),
            m.optimizer().c_str(), static_cast<long long>(m.numel()), m.finalized() ? "" : " (not finalized)");
    if (!m.broken().empty()) f.line("  BROKEN: " + m.broken().substr(0, m.broken().find('\n')));
    f.line("  rank   step  steps/s  step ms   tokens/s   loss      state");
    for (const auto& r : m.ranks()) {
      const auto it = now.ranks.find({m.model(), r.rank()});
      const std::map<std::string, double> empty;
      const auto& cur = it == now.ranks.end() ? empty : it->second;
      const std::map<std::string, double>* old = nullptr;
      if (before) {
        const auto ot = before->ranks.find({m.model(), r.rank()});
        if (ot != before->ranks.end()) old = &ot->second;
      }
      char rate[16] = "-", step_ms[16] = "-", tok[16] = "-", loss[16] = "-";
      const double count = get(cur, "zerod_step_seconds_count"), sum = get(cur, "zerod_step_seconds_sum");
      if (old && dt > 0) {
        const double dsteps = get(cur, "zerod_steps_total") - get(*old, "zerod_steps_total");
        std::snprintf(rate, sizeof rate, "%.1f", dsteps / dt);
        const double dc = count - get(*old, "zerod_step_seconds_count");
        if (dc > 0) std::snprintf(step_ms, sizeof step_ms, "%.1f", (sum - get(*old, "zerod_step_seconds_sum")) / dc * 1e3);
      } else if (count > 0) {
        std::snprintf(step_ms, sizeof step_ms, "%.1f", sum / count * 1e3);
      }
      const double tps = get(cur, "zerod_tokens_per_second"), sps = get(cur, "zerod_samples_per_second");
      if (tps > 0)
        std::snprintf(tok, sizeof tok, "%s", human_rate(tps).c_str());
      else if (sps > 0)
        std::snprintf(tok, sizeof tok, "%s smp", human_rate(sps).c_str());
      if (cur.count("zerod_loss")) std::snprintf(loss, sizeof loss, "%.4g", get(cur, "zerod_loss"));
      f.linef("  %-5d %6lld  %7s  %7s  %9s  %-8s  %s", r.rank(), static_cast<long long>(r.step()), rate, step_ms,
              tok, loss, r.state().c_str());
    }
    f.line("  memory: current / peak / budget (the bar is current against the budget, else the peak)");
    for (const auto& r : m.ranks()) {
      const auto it = now.ranks.find({m.model(), r.rank()});
      if (it == now.ranks.end()) continue;
      const auto& cur = it->second;
      for (const char* tier : kTiers) {
        double total = 0;
        for (const auto& [k, v] : cur)
          if (k.rfind("zerod_memory_bytes{", 0) == 0 && k.find("tier=" + std::string(tier)) != std::string::npos)
            total += v;
        const double peak = get(cur, "zerod_memory_peak_bytes{tier=" + std::string(tier) + "}");
        const double budget = get(cur, "zerod_memory_budget_bytes{tier=" + std::string(tier) + "}", -1);
        if (total == 0 && peak == 0 && budget < 0) continue;
        const double fill = budget > 0 ? total / budget : peak > 0 ? total / peak : 0;
        f.linef("  rank %-3d %-6s %s %10s / %10s / %s", r.rank(), tier, bar(fill, 20).c_str(), human_bytes(total).c_str(),
                human_bytes(peak).c_str(), budget < 0 ? "none" : human_bytes(budget).c_str());
      }
    }
    f.line("  where the time went since the last refresh (share of wall time):");
    for (const auto& r : m.ranks()) {
      const auto it = now.ranks.find({m.model(), r.rank()});
      const std::map<std::string, double>* old = nullptr;
      if (before) {
        const auto ot = before->ranks.find({m.model(), r.rank()});
        if (ot != before->ranks.end()) old = &ot->second;
      }
      if (it == now.ranks.end() || !old || dt <= 0) {
        f.linef("  rank %-3d (after the next refresh)", r.rank());
        continue;
      }
      const auto& cur = it->second;
      auto share = [&](const std::string& k) { return 100.0 * (get(cur, k) - get(*old, k)) / dt; };
      auto per_s = [&](const std::string& k) { return (get(cur, k) - get(*old, k)) / dt; };
      // Who the waits were for: the rank whose lateness cost the most.
      std::string late;
      double worst = 0;
      for (const auto& [k, v] : cur) {
        if (k.rfind("zerod_peer_wait_by_rank_seconds_total{", 0) != 0) continue;
        const double d = v - get(*old, k);
        if (d > worst) {
          worst = d;
          late = k.substr(k.find("late_rank=") + 10);
          late.pop_back();
        }
      }
      f.linef("  rank %-3d prefetch wait %4.1f%%  update wait %4.1f%%  peers %4.1f%%%s  reduce %4.1f%%  nvme %4.1f%% | "
              "comm %s/s, nvme %s/s in, %s/s out",
              r.rank(), share("zerod_prefetch_wait_seconds_total"), share("zerod_update_wait_seconds_total"),
              share("zerod_peer_wait_seconds_total"),
              late.empty() ? "" : (" (rank " + late + " late)").c_str(), share("zerod_reduce_wait_seconds_total"),
              share("zerod_nvme_wait_seconds_total"), human_bytes(per_s("zerod_comm_sent_bytes_total")).c_str(),
              human_bytes(per_s("zerod_nvme_read_bytes_total")).c_str(),
              human_bytes(per_s("zerod_nvme_written_bytes_total")).c_str());
    }
  }
  return f.text();
}

}  // namespace zerod::top
