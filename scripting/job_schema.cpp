#include "job_schema.h"

#include "error.h"

#include <cmath>

namespace zerod::scripting {

namespace {

constexpr double kHuge = 1e300;  // "no upper bound" in the table below

NumberRange ints(double lo, double hi = kHuge) {
  NumberRange r;
  r.min = lo;
  r.max = hi;
  r.integer = true;
  return r;
}

NumberRange nums(double lo, double hi = kHuge, bool lo_exclusive = false) {
  NumberRange r;
  r.min = lo;
  r.max = hi;
  r.min_exclusive = lo_exclusive;
  return r;
}

std::vector<KeySpec> make_schema() {
  using T = KeyType;
  return {
      {"device", T::kChoice, 0, "cpu", {}, {"cpu", "cuda", "auto", "emulated"},
       "Where each rank computes: `cpu`, a bounded shared-memory pool standing in for a GPU; `cuda`, the GPU's "
       "memory; `auto`, cuda where the process sees a GPU; `emulated`, memory the engine cannot address, on the CPU "
       "(a daemon's ranks only: tests of the GPU paths without a GPU). A trainer's `zd_model_options.device` overrides it, "
       "under a daemon too ([devices.md](devices.md))."},
      {"precision", T::kChoice, 0, "fp32", {}, {"fp32", "bf16", "fp16"},
       "The 16-bit type parameters may be registered as (a parameter may always be `f32`). `fp16` turns on loss "
       "scaling. The fp32 master copy exists in every precision."},
      {"grad_accum_dtype", T::kChoice, 0, "working", {}, {"working", "fp32"},
       "Type of the gradient accumulation buffers, and the type every ZeRO stage averages the gradients over "
       "ranks in. `working` keeps the parameter's own type (DeepSpeed's fp16 behaviour; the memory figures of "
       "DESIGN.md §4 assume it): 16-bit gradients stay 16-bit on the wire. `fp32` accumulates exactly at 2 extra "
       "bytes per 16-bit parameter, and reduces in fp32: a 16-bit parameter's gradients send twice the bytes."},
      {"gradient_accumulation_steps", T::kInteger, 1, "", ints(1, 1 << 30), {},
       "Micro-batches per optimizer step. `zd_step()` is called after every micro-batch and applies the optimizer "
       "at each boundary."},
      {"gradient_clipping", T::kNumber, 0, "0 (off)", nums(0), {},
       "Maximum global L2 norm of the averaged, unscaled gradient (PyTorch's `clip_grad_norm_` rule: multiply by "
       "`max/(norm + 1e-6)` when the norm is larger)."},
      {"threads", T::kInteger, 0, "0 (all)", ints(0, 4096), {},
       "CPU threads for the optimizer step; 0 = every core the process may run on."},
      {"fp16", T::kTable, 0, "loss scaling on", {}, {},
       "Loss scaling; only with `precision = \"fp16\"` (an error otherwise, so settings never silently do "
       "nothing)."},
      {"fp16.loss_scale", T::kNumber, 0, "0 (dynamic)", nums(0), {},
       "0 = dynamic scaling; > 0 = this fixed scale."},
      {"fp16.initial_scale_power", T::kInteger, 16, "", ints(0, 64), {}, "The dynamic scale starts at 2^power."},
      {"fp16.loss_scale_window", T::kInteger, 1000, "", ints(1, 0x1p40), {},
       "Clean steps since the last overflow before the scale doubles (`window_rule` says on which update)."},
      {"fp16.window_rule", T::kChoice, 0, "torch", {}, {"torch", "deepspeed"},
       "When the dynamic scale doubles: `torch` on the window-th clean update since the last overflow (torch's "
       "GradScaler, `growth_interval`); `deepspeed` on the update after that, as DeepSpeed's DynamicLossScaler "
       "counts (never on a job's first update). A DeepSpeed config gets `deepspeed`."},
      {"fp16.hysteresis", T::kInteger, 2, "", ints(1, 1 << 20), {},
       "The overflow that halves the scale: with 2 the first overflow only skips its step and the second (not "
       "necessarily the next step) halves it; 1 halves at every overflow. The count is refilled only when "
       "`loss_scale_window` clean steps double the scale (after every clean step with `consecutive_hysteresis`), "
       "so after a halving every overflow halves it at once until then."},
      {"fp16.consecutive_hysteresis", T::kBoolean, 0, "", {}, {},
       "Refill the hysteresis after every clean step."},
      {"fp16.min_loss_scale", T::kNumber, 1, "", nums(0, kHuge, true), {}, "The scale never goes below this."},
      {"fp16.raise_error_at_min_scale", T::kBoolean, 1, "", {}, {},
       "An overflow with the dynamic scale at `min_loss_scale` and no hysteresis left fails `zd_step` "
       "(`ZD_ERR_CONFIG`; the window is skipped, nothing updated), as DeepSpeed's ZeRO optimizers stop there: "
       "no lower scale is left to try, so every later step would be skipped too. `false` skips such steps and "
       "goes on, as DeepSpeed's fp16 optimizer without ZeRO does. Overflows are logged either way (the first 5, "
       "then every 100th)."},
      {"zero", T::kTable, 0, "stage 0", {}, {},
       "The partitioner plugin and its hyperparameters (the shipped ones are listed below)."},
      {"zero.stage", T::kInteger, 0, "", ints(0, 3), {},
       "The ZeRO stage: which state is split across ranks ([daemon.md](daemon.md#zero-stages)). It names the "
       "partitioner plugin `stage<N>`."},
      {"zero.partitioner", T::kString, 0, "none", {}, {},
       "Another partitioner plugin, by name (instead of `stage`). The job's ZeRO stage (offload.params, "
       "checkpoint manifests, `zerod status`) is the one whose state it splits."},
      {"comm", T::kTable, 0, "local", {}, {}, "The comm plugin and its hyperparameters."},
      {"comm.backend", T::kString, 0, "\"local\"", {}, {},
       "The comm plugin: `local` serves the ranks of one daemon over shared memory; `mpi` spans daemons "
       "([multinode.md](multinode.md)); `nccl` spans daemons on GPUs, run with two daemons on one H200 so far "
       "([nccl.md](nccl.md)). Unnamed, it is `local` for a daemon alone and `mpi` for one of several nodes."},
      // At most 1e7 s, as the mpi and nccl plugins take: a deadline is a
      // count of nanoseconds, and 1e10 s of them overflowed it into the past
      // (every wait failed at once); 0 is how a job says forever.
      {"comm.timeout", T::kNumber, 300, "", nums(0, 1e7), {},
       "Seconds, at most 1e7 (about 4 months): a collective not started after this fails on every rank, naming "
       "where each rank was; 0 = wait forever."},
      {"daemon", T::kTable, 0, "see below", {}, {}, "What the daemon does with the job."},
      {"daemon.keep_state", T::kBoolean, 0, "", {}, {},
       "Keep the model in the daemon when a rank is lost after finalize (its connection gone without "
       "zd_model_destroy), so restarted ranks resume from the last applied step; a model every rank destroyed "
       "is forgotten, and one whose optimizer step stopped part-way (a disk error) is not kept: the restart is "
       "told why and resumes from a checkpoint or snapshot ([daemon.md](daemon.md#when-things-go-wrong))."},
      {"budgets", T::kTable, 0, "none", {}, {}, "Bytes each rank may hold per tier, checked at finalize."},
      {"budgets.device", T::kSize, 0, "none", {}, {},
       "Bytes of the device tier each rank may hold (on a CPU rank: its shared-memory pool; ranks sharing a GPU "
       "each have this much, and a warning says when together that is more than the GPU has). A model that does "
       "not fit is refused at finalize with a per-tier table."},
      {"budgets.host", T::kSize, 0, "none", {}, {},
       "Bytes of host RAM each rank may use for model state ([offload.md](offload.md#budgets-and-zerod-plan))."},
      {"budgets.nvme", T::kSize, 0, "none", {}, {}, "Bytes of disk each rank may use for model state."},
      {"offload", T::kTable, 0, "all on the device", {}, {},
       "Where the optimizer state and stage-3 parameter shards live, and the tier plugins' `host = {...}`, "
       "`nvme = {...}` ([offload.md](offload.md))."},
      {"offload.optimizer", T::kChoice, 0, "device", {}, {"device", "host", "nvme"},
       "The tier of the fp32 master copy and the optimizer state."},
      {"offload.params", T::kChoice, 0, "device", {}, {"device", "host", "nvme"},
       "The tier of the stage-3 parameter shards (ZeRO stage 3 only)."},
      {"offload.ratio", T::kNumber, 1, "", nums(0, 1), {},
       "The share of the optimizer's elements placed on `offload.optimizer`; the rest stays on the device."},
      {"offload.nvme_path", T::kStrings, 0, "none", {}, {},
       "Directories for state on nvme (relative to the script's folder); required when anything is on nvme."},
      {"offload.buffer_count", T::kInteger, 4, "", ints(3, 64), {},
       "Staging buffer sets of the NVMe pipeline (read ahead, compute, write behind)."},
      {"offload.tile_size", T::kSize, 0, "4MiB", {}, {}, "Bytes of fp32 state streamed per NVMe transfer."},
      {"offload.accumulate", T::kChoice, 0, "auto", {}, {"auto", "device", "host"},
       "ZeRO stages 2-3 with the optimizer off the device and `gradient_accumulation_steps` > 1: where the "
       "micro-batches before a window's last add up their gradients. `host`: every micro-batch's gradients "
       "leave the device; `device`: in a buffer of the rank's owned gradients on the device, so only the "
       "window's sum leaves; `auto`: the device when that buffer takes at most a quarter of the device budget "
       "([offload.md](offload.md#gradient-accumulation)). The same bits either way."},
      {"offload.overlap", T::kBoolean, 1, "", {}, {},
       "The CPU's update of state in host memory runs behind `zd_step`, module by module in the order of the "
       "forward, while the next forward runs: each `forward_begin` waits only for its module. The same bits as "
       "`false` (the update inside `zd_step`) ([offload.md](offload.md#the-overlapped-update))."},
      {"snapshot", T::kTable, 0, "none", {}, {},
       "Snapshots the engine writes by itself; with them `zerod run` restarts a daemon that dies "
       "([checkpoints.md](checkpoints.md#snapshots))."},
      {"snapshot.path", T::kString, 0, "required", {}, {},
       "The directory of the snapshots (relative to the script's folder; not empty); one model's alone: a "
       "second model over it waits up to comm.timeout for the first to go, then is refused."},
      {"snapshot.every", T::kInteger, 0, "0 (at exit)", ints(0, 0x1p40), {},
       "Steps between snapshots; 0 = only at a clean exit."},
      {"snapshot.keep", T::kInteger, 2, "", ints(1, 1000), {}, "The newest this many are kept."},
      {"snapshot.resume", T::kBoolean, 1, "", {}, {}, "A new job over the path resumes from the newest."},
      {"trace", T::kTable, 0, "none (no trace)", {}, {},
       "A timeline of chosen steps (Chrome trace JSON) ([observability.md](observability.md))."},
      {"trace.path", T::kString, 0, "required", {}, {},
       "The file the trace is written to (relative to the working directory of the process that writes it); "
       "`zerod run --trace FILE` sets it for a run."},
      {"trace.steps", T::kTable, 0, "{2, 6}", {}, {},
       "`{from, to}`, integers >= 1, from <= to: the optimizer steps recorded (step 1 records the module order)."},
      {"trace.events_per_thread", T::kInteger, 65536, "", ints(1024, 0x1p26), {},
       "Each recording thread's ring of events (about 100 bytes each); the oldest are overwritten when full, "
       "counted, and a warning says so."},
      {"metrics", T::kTable, 0, "none (off)", {}, {}, "Prometheus metrics served by the daemon."},
      {"metrics.listen", T::kString, 0, "none", {}, {},
       "`\"host:port\"` (port 0: any free port) or a unix socket (`\"unix:PATH\"` or a path beginning with `/`); "
       "`zerod run --metrics ADDR` overrides it. Embedded trainers serve none."},
      {"optimizer", T::kTable, 0, "{ type = \"adamw\" }", {}, {},
       "`type` names the optimizer plugin; the other keys are that plugin's hyperparameters (below)."},
      {"optimizer.type", T::kString, 0, "\"adamw\"", {}, {}, "The optimizer plugin."},
      {"optimizer.state_dtype", T::kChoice, 0, "fp32", {}, {"fp32", "bf16"},
       "What the optimizer's state (Adam's `m` and `v`) is kept in: `bf16` takes 2 bytes per element instead of "
       "4, in whatever tier the state lives, and is updated in fp32 and rounded back to nearest even each step; "
       "the fp32 master copy stays, and checkpoints hold fp32 (they load into a job of either state dtype). "
       "Optimizers of plugin ABI v4 that support it: `adam`, `adamw`; refused, naming the plugin, for the others "
       "(accepted and without effect for one that keeps no state, `sgd` without momentum) and for compressing "
       "optimizers ([offload.md](offload.md#bf16-optimizer-state))."},
      {"placement", T::kFunction, 0, "none", {}, {},
       "`placement(t)` → `\"device\"`, `\"host\"`, `\"nvme\"` or nil for each tensor and kind at finalize "
       "([offload.md](offload.md#a-placement-policy-in-lua))."},
      {"plugin_path", T::kStrings, 0, "{}", {}, {},
       "Extra folders searched for plugins, relative to the script's folder."},
      {"compression", T::kTable, 0, "none", {}, {},
       "Schedules of a compressing optimizer (plugin ABI v3: `onebit_adam`, `zero_one_adam`, `onebit_lamb`) "
       "([onebit.md](onebit.md)); an optimizer that never compresses (`adam`, `adamw`, `sgd`) or of an older "
       "plugin ABI refuses them."},
      {"compression.warmup", T::kFunction, 0, "the optimizer's own rule", {}, {},
       "`warmup(step)` → `true` when the update after `step` applied updates is a full-precision warm-up step "
       "(1-bit Adam / 1-bit LAMB: plain Adam / LAMB; 0/1 Adam: a variance step). Replaces the plugin's own rule "
       "(`freeze_step`, `var_update_scaler`)."},
      {"compression.sync", T::kFunction, 0, "the optimizer's own rule", {}, {},
       "0/1 Adam with `local_steps`: `sync(step)` → `true` when the update after `step` is a sync step (the ranks' "
       "moves averaged, 1-bit compressed), `false` a local step (nothing sent). Replaces `local_step_scaler` / "
       "`local_step_clipper`; the other optimizers ignore it."},
      {"compression.replay", T::kBoolean, 0, "", {}, {},
       "ZeRO stages 1-3, fp32 working copies, `onebit_adam`, `zero_one_adam` (with `local_steps = false`) or "
       "`onebit_lamb`: after each compressed step every rank replays the update of the elements other ranks own "
       "from the exchanged 1-bit values and whole copies of the state that update reads (1-bit Adam: the frozen "
       "variance, 4 bytes per parameter; 0/1 Adam and 1-bit LAMB: `m` and `v`, 8; 1-bit LAMB's trust ratios "
       "come from the owners' norms, summed), bit for bit what their owners compute, so the working copies are "
       "not all-gathered after the step (stages 1-2) nor in forward and backward (stage 3, which keeps a whole "
       "fp32 copy of the parameters for it, 4 bytes per parameter more, in the tier of the gradients) "
       "([onebit.md](onebit.md#zero-stage-support)). Refused at stage 0, with 16-bit working copies and for "
       "optimizers whose steps cannot be replayed (a plugin built before plugin ABI v3)."},
      {"lr", T::kFunction, 0, "none", {}, {},
       "`lr(step)` → learning rate for the update after `step` applied updates (0 for the first). Without it the "
       "optimizer's `lr` is used. A trainer that computes its own schedule replaces either with `zd_model_set_lr` "
       "from the next update on ([abi.md](abi.md#the-trainers-learning-rate-17))."},
  };
}

std::string bound(double v) { return v >= 0x1p40 ? "" : format_number(v); }

}  // namespace

std::string KeySpec::leaf() const {
  const auto dot = key.rfind('.');
  return std::string(dot == std::string_view::npos ? key : key.substr(dot + 1));
}

std::string KeySpec::type_text() const {
  switch (type) {
    case KeyType::kInteger:
    case KeyType::kNumber: {
      const std::string word = type == KeyType::kInteger ? "integer" : "number";
      const std::string lo = format_number(range.min), hi = bound(range.max);
      if (!hi.empty() && !range.min_exclusive) return word + " " + lo + ".." + hi;
      return word + (range.min_exclusive ? " > " : " ≥ ") + lo;
    }
    case KeyType::kBoolean: return "boolean";
    case KeyType::kChoice: {
      std::string s;
      for (auto c : choices) s += (s.empty() ? "`\"" : " \\| `\"") + std::string(c) + "\"`";
      return s;
    }
    case KeyType::kString: return "string";
    case KeyType::kStrings: return "string or list";
    case KeyType::kSize: return "size";
    case KeyType::kTable: return "table";
    case KeyType::kFunction: return "function";
  }
  return "?";
}

std::string KeySpec::default_text() const {
  if (type == KeyType::kChoice) return "\"" + std::string(def_text) + "\"";
  if (!def_text.empty()) return std::string(def_text);
  if (type == KeyType::kBoolean) return def != 0 ? "true" : "false";
  return format_number(def);
}

const std::vector<KeySpec>& job_schema() {
  static const std::vector<KeySpec> schema = make_schema();
  return schema;
}

const KeySpec& job_key(std::string_view key) {
  for (const KeySpec& k : job_schema())
    if (k.key == key) return k;
  fail(ZD_ERR_INTERNAL, "job schema: no key '" + std::string(key) + "'");
}

std::string job_schema_markdown() {
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const KeySpec& k : job_schema()) {
    std::string def = k.default_text();
    // Literal values in code font; words ("none", "0 (off)") as they are.
    if (k.type != KeyType::kTable && k.type != KeyType::kFunction && def.find(' ') == std::string::npos)
      def = "`" + def + "`";
    out += "| `" + std::string(k.key) + "` | " + k.type_text() + " | " + def + " | " + std::string(k.help) + " |\n";
  }
  return out;
}

}  // namespace zerod::scripting
