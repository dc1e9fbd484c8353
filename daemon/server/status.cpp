#include "status.h"

#include "model_host.h"
#include "metrics_text.h"
#include "server.h"

#include "memory/ledger.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>

namespace zerod::server {

namespace {

std::string rank_state(const RankActivity& a, bool connected) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - a.since).count();
  const std::string target = a.call + (a.module.empty() ? "" : "('" + a.module + "')");
  char buf[512];
  if (a.lost)
    std::snprintf(buf, sizeof buf, "lost: %s", a.lost_reason.c_str());
  else if (!connected)
    std::snprintf(buf, sizeof buf, "not connected");
  else if (a.in_call)
    std::snprintf(buf, sizeof buf, "in %s for %.1f s", target.c_str(), secs);
  else
    std::snprintf(buf, sizeof buf, "idle %.1f s after %s", secs, target.c_str());
  return buf;
}

// What each model's ranks on this node have held in host RAM at their
// peaks, by model id: the host tier's peak, and the device tier's where it
// is host RAM. Each rank's tiers peak on their own: their sum bounds what
// was held at once. It counts the short-lived buffers (a step's reduce
// buffers, gathers) that the node's memory is not charged for.
std::map<int, uint64_t> host_ram_peaks(Server& server) {
  std::map<int, uint64_t> peaks;
  for (const auto& host : server.models()) {
    const Model& m = host->model();
    uint64_t bytes = 0;
    for (int r = m.first_local_rank(); r < m.first_local_rank() + m.local_ranks(); ++r) {
      const MemoryLedger& l = m.ledger(r);
      bytes += l.peak(ZD_TIER_HOST, ZD_MEM_ALL) + (host->device_in_host_ram() ? l.peak(ZD_TIER_DEVICE, ZD_MEM_ALL) : 0);
    }
    peaks[host->id()] = bytes;
  }
  return peaks;
}

}  // namespace

void fill_status(Server& server, v1::StatusReply* out) {
  out->set_version(ZEROD_VERSION_STRING);
  out->set_pid(static_cast<int32_t>(getpid()));
  out->set_socket(server.socket_path());
  out->set_uptime_s(server.uptime_s());
  const std::vector<ServedJob> jobs = server.jobs();
  int ranks = 0;
  for (const ServedJob& j : jobs) ranks += j.world_size;
  out->set_world_size(server.multi_job() ? ranks : server.world_size());
  if (const NodeMemory* nm = server.node_memory()) {
    out->set_jobs(static_cast<int32_t>(jobs.size()));
    out->set_host_memory(nm->capacity());
    out->set_host_memory_held(nm->held());
    out->set_host_memory_holders(nm->holders(host_ram_peaks(server)));
  }
  out->set_metrics(render_metrics(server));  // what `zerod top` shows
  for (const auto& host : server.models()) {
    const Model& m = host->model();
    v1::ModelStatus* ms = out->add_models();
    ms->set_model(host->id());
    ms->set_job(host->script_name());
    if (server.multi_job()) ms->set_served_job(host->job()->label);
    ms->set_zero_stage(m.config().zero_stage);
    ms->set_optimizer(m.config().optimizer);
    // Ranks may be registering on their threads: a summary read under the
    // registry's lock, never the registry itself.
    const Model::RegistrySummary reg = m.registry_summary();
    ms->set_params(static_cast<int32_t>(reg.params));
    ms->set_modules(static_cast<int32_t>(reg.modules));
    ms->set_numel(static_cast<int64_t>(reg.numel));
    ms->set_finalized(m.finalized());
    ms->set_broken(m.broken_reason());
    const auto acts = m.activity().snapshot();
    for (int r = m.first_local_rank(); r < m.first_local_rank() + m.local_ranks(); ++r) {
      const RankActivity& a = acts[static_cast<size_t>(r)];
      v1::RankStatus* rs = ms->add_ranks();
      rs->set_rank(r);
      rs->set_connected(host->attached(r));
      rs->set_pid(server.rank_pid(*host->job(), r));
      rs->set_state(rank_state(a, host->attached(r)));
      rs->set_step(a.step);
      rs->set_micro_step(a.micro_step);
      rs->set_comm_bytes_sent(m.comm_figures(r).bytes_sent);  // not comm(): a restart may replace it meanwhile
      const MemoryLedger& l = m.ledger(r);
      for (int t = 0; t < ZD_TIER_COUNT; ++t) {
        v1::TierBytes* tb = rs->add_tiers();
        tb->set_tier(tier_name(t));
        for (int k = 0; k < ZD_MEM_KIND_COUNT; ++k) tb->add_current(l.current(t, k));
        tb->set_peak(l.peak(t, ZD_MEM_ALL));
        tb->set_budget(l.budget(t));
      }
      if (r == m.first_local_rank()) {  // this daemon's first rank: rank 0 only on node 0
        v1::StepFigures* f = ms->mutable_last_step();
        f->set_step(a.step);
        f->set_micro_step(a.micro_step);
        f->set_lr(a.lr);
        f->set_loss_scale(a.loss_scale);
        f->set_grad_norm(a.grad_norm);
        f->set_skipped(a.last_skipped);
      }
    }
  }
}

std::string format_status(const v1::StatusReply& s) {
  std::string out;
  char line[1024];
  std::snprintf(line, sizeof line, "zerod %s, pid %d, %d rank%s, up %.1f s, socket %s\n",
                s.version().c_str(), s.pid(), s.world_size(), s.world_size() == 1 ? "" : "s",
                s.uptime_s(), s.socket().c_str());
  out += line;
  if (s.host_memory() > 0) {
    std::snprintf(line, sizeof line, "serving %d job%s; their planned model state holds %s of the %s of host memory "
                  "they may hold together (short-lived buffers are not charged: each model's peak shows them)\n",
                  s.jobs(), s.jobs() == 1 ? "" : "s", format_bytes(s.host_memory_held()).c_str(),
                  format_bytes(s.host_memory()).c_str());
    out += line + s.host_memory_holders();
  }
  if (s.models().empty()) out += "no models\n";
  for (const auto& m : s.models()) {
    std::snprintf(line, sizeof line,
                  "\nmodel %d: %s%s%s, ZeRO stage %d, %s, %d parameters (%lld elements) in %d modules%s\n",
                  m.model(), m.served_job().c_str(), m.served_job().empty() ? "" : ", ", m.job().c_str(), m.zero_stage(), m.optimizer().c_str(), m.params(),
                  static_cast<long long>(m.numel()), m.modules(), m.finalized() ? "" : ", not finalized");
    out += line;
    const auto& f = m.last_step();
    std::snprintf(line, sizeof line, "  last step %lld (micro-step %lld): lr %g, loss scale %g, grad norm %g%s\n",
                  static_cast<long long>(f.step()), static_cast<long long>(f.micro_step()), f.lr(),
                  f.loss_scale(), f.grad_norm(), f.skipped() ? " (skipped)" : "");
    out += line;
    if (!m.broken().empty()) out += "  BROKEN: " + m.broken() + "\n";
    out += "  rank  pid      step    state\n";
    for (const auto& r : m.ranks()) {
      std::snprintf(line, sizeof line, "  %-5d %-8d %-7lld %s\n", r.rank(), r.pid(),
                    static_cast<long long>(r.step()), r.state().c_str());
      out += line;
    }
    out += "  bytes per rank and tier: params grads master optimizer buffers | total (peak / budget); comm sent\n";
    for (const auto& r : m.ranks()) {
      for (const auto& t : r.tiers()) {
        uint64_t total = 0;
        for (uint64_t b : t.current()) total += b;
        if (total == 0 && t.peak() == 0 && t.budget() == MemoryLedger::kNoBudget) continue;
        std::string kinds;
        for (uint64_t b : t.current()) kinds += format_bytes(b) + "  ";
        std::snprintf(line, sizeof line, "  rank %d %-6s %s| %s (peak %s / budget %s); comm %s\n", r.rank(),
                      t.tier().c_str(), kinds.c_str(), format_bytes(total).c_str(),
                      format_bytes(t.peak()).c_str(),
                      t.budget() == MemoryLedger::kNoBudget ? "none" : format_bytes(t.budget()).c_str(),
                      format_bytes(r.comm_bytes_sent()).c_str());
        out += line;
      }
    }
  }
  return out;
}

}  // namespace zerod::server
