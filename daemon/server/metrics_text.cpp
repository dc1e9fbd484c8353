#include "metrics_text.h"

#include "model_host.h"
#include "server.h"

#include "memory/ledger.h"
#include "observe/clock.h"

#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <vector>

namespace zerod::server {

namespace {

// One metric family: its HELP and TYPE once, then its samples.
class Family {
 public:
  Family(const char* name, const char* type, const char* help) : name_(name), type_(type), help_(help) {}

  void add(const std::string& labels, double value, const char* suffix = "") {
    char v[64];
    if (std::isnan(value))
      std::snprintf(v, sizeof v, "NaN");
    else if (std::isinf(value))
      std::snprintf(v, sizeof v, value > 0 ? "+Inf" : "-Inf");
    else if (value == std::floor(value) && std::fabs(value) < 1e15)
      std::snprintf(v, sizeof v, "%.0f", value);
    else
      std::snprintf(v, sizeof v, "%.9g", value);
    lines_ += name_ + suffix + (labels.empty() ? "" : "{" + labels + "}") + " " + v + "\n";
  }

  void write(std::string& out) const {
    if (lines_.empty()) return;
    out += "# HELP " + name_ + " " + help_ + "\n# TYPE " + name_ + " " + type_ + "\n" + lines_;
  }

 private:
  std::string name_, type_, help_;
  std::string lines_;
};

std::string label_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

}  // namespace

std::string render_metrics(Server& server) {
  std::deque<Family> f;  // references to its elements stay valid as it grows
  auto family = [&f](const char* name, const char* type, const char* help) -> Family& {
    f.emplace_back(name, type, help);
    return f.back();
  };
  Family& up = family("zerod_uptime_seconds", "gauge", "Seconds since the daemon started.");
  up.add("", server.uptime_s());
  Family& models = family("zerod_model_info", "gauge",
                          "One per model the daemon hosts: its job script, ZeRO stage, optimizer and parameter count.");
  Family& connected = family("zerod_rank_connected", "gauge", "1 while the rank's trainer is attached.");
  Family& steps = family("zerod_steps_total", "counter",
                         "Optimizer steps the rank has applied in this daemon (a load or resume does not move it).");
  Family& step = family("zerod_step", "gauge", "The rank's step: updates applied, counted from its checkpoint's.");
  Family& micro = family("zerod_micro_steps_total", "counter", "Micro-batches the rank has ended with zd_step.");
  Family& step_hist = family("zerod_step_seconds", "histogram",
                             "Time between consecutive accumulation boundaries of the rank (a whole step).");
  Family& mem = family("zerod_memory_bytes", "gauge", "Bytes of model state the rank holds now, per tier and kind.");
  Family& peak = family("zerod_memory_peak_bytes", "gauge", "The most bytes the rank held at once in a tier.");
  Family& budget = family("zerod_memory_budget_bytes", "gauge", "The tier's budget for the rank (budgets.*).");
  Family& pool = family("zerod_device_pool_resident_bytes", "gauge",
                        "Host RAM the rank's device pool holds on the cpu device: its blocks' pages and the free "
                        "ones its steps use again.");
  Family& tokens = family("zerod_tokens_total", "counter", "Tokens the trainer reported (zd_model_report).");
  Family& samples = family("zerod_samples_total", "counter", "Samples the trainer reported (zd_model_report).");
  Family& tok_rate = family("zerod_tokens_per_second", "gauge",
                            "Tokens per second over the trainer's reports of the last 10 seconds.");
  Family& smp_rate = family("zerod_samples_per_second", "gauge",
                            "Samples per second over the trainer's reports of the last 10 seconds.");
  Family& loss = family("zerod_loss", "gauge", "The loss the trainer reported last.");
  Family& lr = family("zerod_learning_rate", "gauge", "The learning rate of the rank's last step.");
  Family& gnorm = family("zerod_grad_norm", "gauge", "The global gradient norm of the rank's last step.");
  Family& comm = family("zerod_comm_sent_bytes_total", "counter",
                        "Bytes the rank's collectives sent to other ranks (as a ring puts them on links).");
  // The comm plugins count what leaves the node for the node (the daemon),
  // not per rank: one sample per model, without a rank label, so that a
  // sum() over the samples is the node's traffic and not a multiple of it.
  Family& net = family("zerod_comm_network_sent_bytes_total", "counter",
                       "Bytes this daemon (node) sent to other nodes for the model's ranks (mpi, nccl comm "
                       "plugins); one sample per model, not per rank.");
  Family& colls = family("zerod_comm_collectives_total", "counter", "Collectives the rank has completed.");
  Family& nvme_r = family("zerod_nvme_read_bytes_total", "counter", "Bytes the rank read from its NVMe store.");
  Family& nvme_w = family("zerod_nvme_written_bytes_total", "counter", "Bytes the rank wrote to its NVMe store.");
  Family& nvme_wait = family("zerod_nvme_wait_seconds_total", "counter",
                             "Time the rank's thread was blocked on NVMe transfers.");
  Family& gwait = family("zerod_prefetch_wait_seconds_total", "counter",
                         "Time the rank's begin calls waited for their module's parameters to be gathered (stage 3).");
  Family& gathers = family("zerod_gathers_total", "counter",
                           "Begin calls that needed a gather, by whether it was already issued (prefetched).");
  Family& pwait = family("zerod_peer_wait_seconds_total", "counter",
                         "Time the rank's collectives waited for another rank of this daemon to arrive.");
  Family& pwait_by = family("zerod_peer_wait_by_rank_seconds_total", "counter",
                            "That wait, by the rank that arrived last (late_rank).");
  Family& late = family("zerod_late_arrivals_total", "counter",
                        "Collectives of the rank at which late_rank arrived last and the rank waited for it.");
  Family& rwait = family("zerod_reduce_wait_seconds_total", "counter",
                         "Time zd_step waited for gradient reductions and collectives in flight.");
  Family& opt = family("zerod_optimizer_seconds_total", "counter", "Time the optimizer ran, by the tier of its state.");
  Family& overlapped = family("zerod_overlapped_updates_total", "counter",
                              "Steps whose host update ran behind zd_step, overlapped with the next forward "
                              "(offload.overlap).");
  Family& uwait = family("zerod_update_wait_seconds_total", "counter",
                         "Time the rank's calls waited for the overlapped host update (a begin call for its "
                         "module's, another call for all of it): what the forward did not hide.");

  const int64_t now = observe::now_ns();
  for (const auto& host : server.models()) {
    const Model& m = host->model();
    const std::string model = "model=\"" + std::to_string(host->id()) + "\"";
    models.add(model + ",job=\"" + label_escape(host->script_name()) + "\",zero_stage=\"" +
                   std::to_string(m.config().zero_stage) + "\",optimizer=\"" + label_escape(m.config().optimizer) +
                   "\",params=\"" + std::to_string(m.registry_summary().numel) + "\"",
               1);
    const auto acts = m.activity().snapshot();
    net.add(model, static_cast<double>(m.comm_figures(m.first_local_rank()).network_bytes_sent));
    for (int r = m.first_local_rank(); r < m.first_local_rank() + m.local_ranks(); ++r) {
      const std::string rl = model + ",rank=\"" + std::to_string(r) + "\"";
      const RankActivity& a = acts[static_cast<size_t>(r)];
      const observe::RankCounters& c = m.counters(r);
      connected.add(rl, host->attached(r) ? 1 : 0);
      steps.add(rl, static_cast<double>(c.steps_applied.load(std::memory_order_relaxed)));
      step.add(rl, static_cast<double>(a.step));
      micro.add(rl, static_cast<double>(a.micro_step));
      const auto h = c.step_seconds.snapshot();
      for (size_t i = 0; i < h.cumulative.size(); ++i) {
        char le[32];
        std::snprintf(le, sizeof le, "%g", observe::Histogram::kBounds[i]);
        step_hist.add(rl + ",le=\"" + le + "\"", static_cast<double>(h.cumulative[i]), "_bucket");
      }
      step_hist.add(rl + ",le=\"+Inf\"", static_cast<double>(h.count), "_bucket");
      step_hist.add(rl, h.sum, "_sum");
      step_hist.add(rl, static_cast<double>(h.count), "_count");
      const MemoryLedger& l = m.ledger(r);
      for (int t = 0; t < ZD_TIER_COUNT; ++t) {
        const std::string tl = rl + ",tier=\"" + tier_name(t) + "\"";
        for (int k = 0; k < ZD_MEM_KIND_COUNT; ++k)
          mem.add(tl + ",kind=\"" + mem_kind_name(k) + "\"", static_cast<double>(l.current(t, k)));
        peak.add(tl, static_cast<double>(l.peak(t, ZD_MEM_ALL)));
        if (l.budget(t) != MemoryLedger::kNoBudget) budget.add(tl, static_cast<double>(l.budget(t)));
      }
      if (const uint64_t held = m.device(r).pool_resident_bytes()) pool.add(rl, static_cast<double>(held));
      tokens.add(rl, static_cast<double>(c.tokens.load(std::memory_order_relaxed)));
      samples.add(rl, static_cast<double>(c.samples.load(std::memory_order_relaxed)));
      tok_rate.add(rl, c.tokens_rate.rate(now));
      smp_rate.add(rl, c.samples_rate.rate(now));
      if (c.reports_with_loss.load(std::memory_order_relaxed) > 0) loss.add(rl, c.loss());
      if (a.step > 0) {
        lr.add(rl, a.lr);
        gnorm.add(rl, a.grad_norm);
      }
      const zd_comm_figures cf = m.comm_figures(r);
      comm.add(rl, static_cast<double>(cf.bytes_sent));
      colls.add(rl, static_cast<double>(cf.collectives));
      nvme_r.add(rl, static_cast<double>(c.nvme_read_bytes.load(std::memory_order_relaxed)));
      nvme_w.add(rl, static_cast<double>(c.nvme_write_bytes.load(std::memory_order_relaxed)));
      nvme_wait.add(rl, seconds(c.nvme_wait_ns.load(std::memory_order_relaxed)));
      gwait.add(rl, seconds(c.gather_wait_ns.load(std::memory_order_relaxed)));
      gathers.add(rl + ",prefetched=\"true\"", static_cast<double>(c.gathers_ready.load(std::memory_order_relaxed)));
      gathers.add(rl + ",prefetched=\"false\"", static_cast<double>(c.gathers_waited.load(std::memory_order_relaxed)));
      pwait.add(rl, seconds(c.peer_wait_ns.load(std::memory_order_relaxed)));
      for (int j = 0; j < c.ranks; ++j) {
        if (c.first_rank + j == r) continue;
        const std::string ll = rl + ",late_rank=\"" + std::to_string(c.first_rank + j) + "\"";
        pwait_by.add(ll, seconds(c.peer_wait_by_late[static_cast<size_t>(j)].load(std::memory_order_relaxed)));
        late.add(ll, static_cast<double>(c.late_count[static_cast<size_t>(j)].load(std::memory_order_relaxed)));
      }
      rwait.add(rl, seconds(c.reduce_wait_ns.load(std::memory_order_relaxed)));
      for (int t = 0; t < ZD_TIER_COUNT; ++t)
        opt.add(rl + ",tier=\"" + tier_name(t) + "\"",
                seconds(c.optimizer_ns[static_cast<size_t>(t)].load(std::memory_order_relaxed)));
      overlapped.add(rl, static_cast<double>(c.overlapped_updates.load(std::memory_order_relaxed)));
      uwait.add(rl, seconds(c.update_wait_ns.load(std::memory_order_relaxed)));
    }
  }
  std::string out;
  for (const Family& fam : f) fam.write(out);
  return out;
}

}  // namespace zerod::server
