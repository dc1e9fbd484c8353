#include "job_plan.h"

#include "device/emulated_device.h"
#include "device/select.h"
#include "error.h"
#include "model/model.h"
#include "runtime/plugin_host.h"

#include <zerod/kit/text.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <utility>

namespace zerod::cli {

namespace {

// The emulated device's address space for a plan: nothing is allocated on
// it, so a little (each rank reserves its own).
constexpr uint64_t kPlanSpace = uint64_t{1} << 20;

// A GPU planned for without one (job_plan.h): the emulated device, one GPU
// per rank, named and refusing as the cuda device. Whether the optimizer
// has CUDA kernels is known only to a build with CUDA (a build without has
// plugins without them, unlike the GPU machine's); elsewhere it is assumed.
class PlannedGpu final : public EmulatedDevice {
 public:
  PlannedGpu(MemoryLedger& ledger, Workers& workers, int gpu, bool kernels_known, const std::string& name)
      : EmulatedDevice(ledger, workers, /*exported=*/false, name, kPlanSpace), gpu_(gpu),
        kernels_known_(kernels_known) {}
  const char* name() const override { return "cuda"; }
  int32_t ordinal() const override { return gpu_; }
  std::string describe() const override { return "a GPU, planned on the emulated device"; }
  bool runs(const OptimizerInstance& opt) const override { return !kernels_known_ || opt.has_cuda(); }

 private:
  int gpu_;
  bool kernels_known_;
};

// The device a plan is for, from the job's or --device's request and what
// this machine has.
struct Choice {
  std::string kind;       // "cpu", "cuda", "emulated"
  bool stand_in = false;  // cuda without a GPU: PlannedGpu
  std::string why;        // how the request became `kind`, or ""
  CudaAvailability cuda;  // what this build and machine offer
};

Choice choose(const std::string& request, const PlanTarget& target, const std::string& source) {
  if (request != "cpu" && request != "cuda" && request != "auto" && request != "emulated")
    fail(ZD_ERR_CONFIG, source + ": device = \"" + request + "\" is not a device; use \"cpu\", \"cuda\", \"auto\" or "
                                                             "\"emulated\"");
  Choice c;
  c.kind = request;
  c.cuda = cuda_availability();
  if (request == "cuda" || request == "auto") {
    const CudaAvailability& a = c.cuda;
    if (target.device_memory != 0) {
      c.kind = "cuda";
      c.stand_in = true;
      c.why = "planned without opening a GPU: --device-memory describes it";
    } else if (a.devices > 0) {
      c.kind = "cuda";
      if (request == "auto") c.why = "\"auto\" is the cuda device here";
    } else if (request == "auto") {
      c.kind = "cpu";
      c.why = "\"auto\" is the cpu device here: " + a.why + "; --device cuda plans for a GPU";
    } else {
      c.stand_in = true;
      c.why = "planned without a GPU, which this machine lacks: " + a.why;
    }
  }
  if (target.device_memory != 0 && c.kind != "cuda")
    fail(ZD_ERR_CONFIG, "--device-memory is a GPU's memory, but the plan is for the " + c.kind +
                            " device (" + source + ": device = \"" + request +
                            "\"); add --device cuda to plan for a GPU");
  return c;
}

DeviceFactory opener(const Choice& c, const PlanTarget& target) {
  if (c.stand_in)
    return [memory = target.device_memory, kernels_known = c.cuda.built](
               const std::string&, MemoryLedger& ledger, Workers& workers, int local_rank,
               const std::string& name) -> std::unique_ptr<Device> {
      // The budget the cuda device gives itself where the job set none.
      if (memory != 0 && ledger.budget(ZD_TIER_DEVICE) == MemoryLedger::kNoBudget)
        ledger.set_budget(ZD_TIER_DEVICE, static_cast<uint64_t>(kDefaultBudgetShare * static_cast<double>(memory)));
      return std::make_unique<PlannedGpu>(ledger, workers, std::max(local_rank, 0), kernels_known, name);
    };
  if (c.kind == "emulated")
    return [](const std::string&, MemoryLedger& ledger, Workers& workers, int,
              const std::string& name) -> std::unique_ptr<Device> {
      return std::make_unique<EmulatedDevice>(ledger, workers, /*exported=*/false, name, kPlanSpace);
    };
  return open_device;
}

std::string budget_text(const Model& model, const Choice& c, const PlanTarget& target) {
  const uint64_t b = model.ledger(0).budget(ZD_TIER_DEVICE);
  const bool job_set = model.config().device_budget != MemoryLedger::kNoBudget;
  const std::string share = std::to_string(static_cast<int>(kDefaultBudgetShare * 100)) + "%";
  if (job_set) return "device budget " + format_bytes(b) + ": budgets.device";
  if (c.stand_in && target.device_memory != 0)
    return "device budget " + format_bytes(b) + ": " + share + " of --device-memory " +
           format_bytes(target.device_memory) + ", as a GPU takes it where budgets.device is unset";
  if (c.stand_in)
    return "no device budget: budgets.device is unset, and a GPU would take " + share +
           " of its free memory (--device-memory SIZE plans with that)";
  if (b == MemoryLedger::kNoBudget) return "no device budget: budgets.device is unset";
  return "";  // a GPU here: its description says its budget
}

// A plan lays the model out and nothing more. What the job writes or
// serves while it runs is off: a snapshot.path is created and locked when
// the Model is built (so a plan beside the running job waited comm.timeout
// for its lock, then failed), a trace.path's folder is made and probed, and
// metrics.listen is a socket. None of them changes the layout.
JobConfig without_outputs(JobConfig config) {
  config.snapshot = SnapshotConfig{};
  config.trace = TraceConfig{};
  config.metrics = MetricsConfig{};
  return config;
}

// A plan runs no collectives, and the layout does not depend on the comm
// plugin: the local one stands in for the job's, whose creation may need
// what this machine lacks (nccl: a GPU) or other processes (mpi's nodes).
std::unique_ptr<CommInstance> plan_comm(const JobConfig& config, int world) {
  const auto local = Plugin::load(ZD_PLUGIN_COMM, "local", plugin_search_path(config.plugin_path));
  return CommInstance::create(local, local->default_values(), world);
}

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

JobPlan plan_job(scripting::JobScript& script, int world, const std::vector<PlannedTensor>& tensors,
                 const PlanTarget& target) {
  JobConfig config = without_outputs(script.config());
  const std::string request = target.device.empty() ? config.device : target.device;
  const Choice choice = choose(request, target, config.source);
  config.device = choice.kind;
  Model model(config, script.make_plugins(world, 0, -1, plan_comm(config, world)), &script, world, 0, -1,
              opener(choice, target));
  JobPlan plan;
  for (const PlannedTensor& t : tensors) {
    model.register_param(0, t.name, t.module, config.precision, t.shape, nullptr, 0);
    plan.numel += static_cast<uint64_t>(model.registry().params().back().numel);
  }

  plan.device = choice.stand_in ? std::string("cuda") : model.device(0).describe();
  if (!choice.why.empty()) plan.device_notes.push_back(choice.why);
  if (choice.stand_in)
    plan.device_notes.push_back(
        std::string("memory the host cannot address, laid out as on a GPU by the emulated device") +
        (choice.cuda.built ? "" : " (this zerod is built without CUDA: whether the optimizer has CUDA kernels is "
                                  "not checked)"));
  if (std::string b = budget_text(model, choice, target); !b.empty()) plan.device_notes.push_back(std::move(b));

  // Every rank: a placement policy or the ratio gives ranks different
  // shares of each tier (their shards hold different tensors).
  std::map<std::pair<NeedTable, std::array<uint64_t, ZD_TIER_COUNT>>, size_t> seen;
  std::vector<NeedTable> needs;
  plan.worst.budget.fill(MemoryLedger::kNoBudget);
  for (int r = 0; r < world; ++r) {
    TierPlan p = model.plan(r);
    needs.push_back(p.need);
    for (size_t t = 0; t < p.budget.size(); ++t) plan.worst.budget[t] = std::min(plan.worst.budget[t], p.budget[t]);
    auto [at, fresh] = seen.emplace(std::make_pair(p.need, p.budget), plan.groups.size());
    if (fresh) plan.groups.push_back({{}, std::move(p)});
    plan.groups[at->second].ranks.push_back(r);
  }
  // Finalize holds each rank's budgets to the most any rank needs in each
  // cell; with each tier's smallest budget, that is every rank's check.
  plan.worst.need = worst_cells(needs);
  plan.worst_is_a_rank = std::any_of(plan.groups.begin(), plan.groups.end(), [&](const RankGroup& g) {
    return g.plan.need == plan.worst.need && g.plan.budget == plan.worst.budget;
  });
  Placement::table(plan.worst, &plan.fits);
  return plan;
}

}  // namespace zerod::cli
