#include "ds_keys.h"

#include <string>

namespace zerod::scripting {

namespace {

std::vector<DsKey> make_keys() {
  constexpr auto T = DsKey::kTranslated, I = DsKey::kIgnored, D = DsKey::kDefaultOnly,
                 R = DsKey::kRefusedByDeepSpeed;
  const std::string_view kOptimizerKernel = "which DeepSpeed kernel or backend runs the update; zerod's plugin runs it";
  const std::string_view kZeroTuning = "tunes how DeepSpeed moves its buffers; zerod's partitioner has its own";
  const std::string_view kMonitor = "DeepSpeed's own profiler or monitor";
  // DeepSpeed 0.19 refuses these with "... has been removed" (runtime/config.py,
  // _reject_removed_config_keys; deepspeedai/DeepSpeed#8489), whatever their value.
  const std::string_view kRemoved = "DeepSpeed 0.19 removed the feature and refuses the key (deepspeedai/DeepSpeed#8489)";
  return {
      // Batches and accumulation.
      {"train_batch_size", T, "", "checked: micro-batch × accumulation × ranks, as DeepSpeed checks it"},
      {"train_micro_batch_size_per_gpu", T, "", "checked with the others; the batch size of zerod.deepspeed's DataLoader"},
      {"dataloader_drop_last", T, "", "the `drop_last` of zerod.deepspeed's DataLoader (`deepspeed_io`, `training_data`)"},
      {"gradient_accumulation_steps", T, "", "`gradient_accumulation_steps`"},
      {"managed_gradient_accumulation", D, "true",
       "zerod ends an accumulation window at every gradient_accumulation_steps-th step() itself (DeepSpeed's false "
       "leaves the boundary to the trainer, every step() an update)"},
      {"gradient_clipping", T, "",
       "`gradient_clipping` (DeepSpeed 0.19's default, 1.0, is written out when absent, and for an \"auto\" no "
       "trainer filled in)"},
      // Optimizer.
      {"optimizer.type", T, "",
       "`optimizer.type`: Adam → `adamw` (`adam` with adam_w_mode false), AdamW → `adamw`, OneBitAdam → "
       "`onebit_adam` (which DeepSpeed 0.19 no longer has), SGD → `sgd`; any other type is refused"},
      {"optimizer.params.lr", T, "",
       "`optimizer.lr` (DeepSpeed's default 0.001, its optimizers' and torch.optim.SGD's, is written out)"},
      {"optimizer.params.betas", T, "", "`optimizer.betas`"},
      {"optimizer.params.eps", T, "", "`optimizer.eps`"},
      {"optimizer.params.weight_decay", T, "",
       "`optimizer.weight_decay` (DeepSpeed's default is written out: 0, or with `torch_adam` torch.optim.AdamW's "
       "0.01)"},
      {"optimizer.params.bias_correction", T, "", "`optimizer.bias_correction`"},
      {"optimizer.params.adam_w_mode", T, "",
       "Adam: true (the default) → `adamw`, false → `adam`; AdamW: true says it again, false is ignored as "
       "DeepSpeed ignores it (AdamW always decouples weight decay); any other type refuses it, as DeepSpeed does"},
      {"optimizer.params.momentum", T, "", "`optimizer.momentum` (SGD)"},
      {"optimizer.params.dampening", T, "", "`optimizer.dampening` (SGD)"},
      {"optimizer.params.nesterov", T, "", "`optimizer.nesterov` (SGD)"},
      {"optimizer.params.freeze_step", T, "", "`optimizer.freeze_step` (OneBitAdam)"},
      {"optimizer.params.amsgrad", D, "false", "zerod's Adam has no AMSGrad variant"},
      {"optimizer.params.max_grad_norm", R, "",
       "DeepSpeed refuses it in the optimizer's parameters: clipping is the top-level `gradient_clipping`"},
      {"optimizer.params.torch_adam", T, "",
       "Adam/AdamW: DeepSpeed builds torch.optim.AdamW, whose default weight decay of 0.01 is written out where "
       "`weight_decay` is not given (torch.optim.Adam, default 0, for Adam with adam_w_mode false); zerod's plugin "
       "runs the update"},
      {"optimizer.params.fused", I, "", kOptimizerKernel},
      {"optimizer.params.foreach", I, "", kOptimizerKernel},
      {"optimizer.params.cuda_aware", I, "", kOptimizerKernel},
      {"optimizer.params.comm_backend_name", I, "", "1-bit Adam's collectives are zerod's comm plugin (`comm.backend`)"},
      // Scheduler.
      {"scheduler.type", T, "",
       "`lr`: WarmupLR → `zerod.warmup_linear`, WarmupDecayLR → `zerod.warmup_decay`, WarmupCosineLR → "
       "`zerod.warmup_cosine`, OneCycle → `zerod.one_cycle`, LRRangeTest → a Lua function of the step, each as "
       "DeepSpeed steps it; any other type is refused. A parameter the schedule needs given as \"auto\" leaves "
       "`lr` to the trainer integration that fills it in"},
      {"scheduler.params.warmup_min_lr", T, "", "the schedule's `min_lr`"},
      {"scheduler.params.warmup_max_lr", T, "",
       "the schedule's `max_lr` (default: WarmupLR the optimizer's lr, WarmupDecayLR 0.001, as in DeepSpeed)"},
      {"scheduler.params.warmup_num_steps", T, "",
       "the schedule's `warmup_steps` (a whole number >= 1, counted as at least 2, as in DeepSpeed)"},
      {"scheduler.params.warmup_type", T, "", "the schedule's `warmup_type`"},
      {"scheduler.params.total_num_steps", T, "", "the schedule's `total_steps`"},
      {"scheduler.params.warmup_min_ratio", T, "", "`zerod.warmup_cosine`'s `warmup_min_ratio`"},
      {"scheduler.params.cos_min_ratio", T, "", "`zerod.warmup_cosine`'s `cos_min_ratio`"},
      {"scheduler.params.cycle_min_lr", T, "", "`zerod.one_cycle`'s `min_lr`"},
      {"scheduler.params.cycle_max_lr", T, "", "`zerod.one_cycle`'s `max_lr`"},
      {"scheduler.params.cycle_first_step_size", T, "", "`zerod.one_cycle`'s `first_steps`"},
      {"scheduler.params.cycle_second_step_size", T, "", "`zerod.one_cycle`'s `second_steps`"},
      {"scheduler.params.cycle_first_stair_count", T, "",
       "`zerod.one_cycle`'s `first_stairs`: the rise in that many stairs (default 0, a continuous ramp)"},
      {"scheduler.params.cycle_second_stair_count", T, "",
       "`zerod.one_cycle`'s `second_stairs`: the fall in that many stairs (default: the first's, as in DeepSpeed)"},
      {"scheduler.params.decay_lr_rate", T, "", "`zerod.one_cycle`'s `decay_rate`"},
      {"scheduler.params.decay_step_size", T, "", "`zerod.one_cycle`'s `decay_steps`"},
      {"scheduler.params.lr_range_test_min_lr", T, "", "LRRangeTest's starting lr (default 0.001)"},
      {"scheduler.params.lr_range_test_step_size", T, "", "LRRangeTest's steps per interval (default 2000)"},
      {"scheduler.params.lr_range_test_step_rate", T, "", "LRRangeTest's increase per interval (default 1)"},
      {"scheduler.params.lr_range_test_staircase", T, "", "LRRangeTest: whole intervals only (default false)"},
      {"scheduler.params.cycle_momentum", D, "false",
       "OneCycle's momentum cycling rewrites the optimizer's betas every step (β2 becomes 0.99); zerod's "
       "hyperparameters are fixed for a job. DeepSpeed's default is true, so it must be set to false"},
      {"scheduler.params.cycle_min_mom", I, "", "used only with cycle_momentum, which is refused"},
      {"scheduler.params.cycle_max_mom", I, "", "used only with cycle_momentum, which is refused"},
      {"scheduler.params.decay_mom_rate", I, "", "used only with cycle_momentum, which is refused"},
      {"scheduler.params.last_batch_iteration", D, "-1",
       "a resumed schedule takes its step from the checkpoint (`load_checkpoint`)"},
      // Precision.
      {"fp16.enabled", T, "", "`precision = \"fp16\"`"},
      {"fp16.loss_scale", T, "", "`fp16.loss_scale`"},
      {"fp16.initial_scale_power", T, "", "`fp16.initial_scale_power` (DeepSpeed 0.19's default 16 is zerod's)"},
      {"fp16.loss_scale_window", T, "", "`fp16.loss_scale_window`"},
      {"fp16.hysteresis", T, "",
       "`fp16.hysteresis` at ZeRO stages 1-3; at stage 0 DeepSpeed's fp16 optimizer has none (it halves the "
       "scale at every overflow), so the translation writes 1"},
      {"fp16.consecutive_hysteresis", T, "", "`fp16.consecutive_hysteresis` (stages 1-3, as hysteresis)"},
      {"fp16.min_loss_scale", T, "",
       "`fp16.min_loss_scale`. An overflow at it fails the step at ZeRO stages 1-3, as DeepSpeed's scaler raises "
       "there (`fp16.raise_error_at_min_scale`); at stage 0 DeepSpeed's fp16 optimizer keeps skipping, so the "
       "translation writes `raise_error_at_min_scale = false`"},
      {"fp16.zerod_window_rule", T, "",
       "zerod's own key: `fp16.window_rule` (default \"deepspeed\"; \"torch\" for a GradScaler's schedule)"},
      {"fp16.auto_cast", D, "false", "zerod does not cast the model's inputs: cast them, or the model, in the trainer"},
      {"fp16.fp16_master_weights_and_grads", D, "false", "zerod always keeps an fp32 master copy"},
      {"bf16.enabled", T, "", "`precision = \"bf16\"`"},
      {"bf16.immediate_grad_update", I, "", "DeepSpeed's bf16 optimizer internals"},
      {"bf16.check_grad_overflow", I, "", "DeepSpeed's bf16 optimizer internals; zerod skips a non-finite step always"},
      {"bf16.bf16_master_weights_and_grads", D, "false", "zerod always keeps fp32 masters and gradients"},
      {"bf16.bf16_optimizer_states", D, "false",
       "DeepSpeed keeps bf16 optimizer states only with bf16 masters, and zerod always keeps fp32 masters; a zerod "
       "job script keeps Adam's state in bf16 beside fp32 masters with `optimizer.state_dtype = \"bf16\"`"},
      {"bfloat16.enabled", T, "", "the same as `bf16.enabled` (DeepSpeed's older name, read when `bf16` is absent)"},
      {"bfloat16.immediate_grad_update", I, "", "DeepSpeed's bf16 optimizer internals"},
      {"bfloat16.check_grad_overflow", I, "", "DeepSpeed's bf16 optimizer internals; zerod skips a non-finite step always"},
      {"amp", R, "", "DeepSpeed 0.19 removed its apex AMP integration and refuses the block: use fp16 or bf16"},
      {"torch_autocast.enabled", D, "false",
       "zerod does not wrap the forward in torch.autocast: run it under torch.autocast in the training loop, or use "
       "fp16 or bf16"},
      {"torch_autocast.*", I, "", "torch_autocast's dtype and modules, read only with torch_autocast.enabled"},
      {"data_types.grad_accum_dtype", T, "", "`grad_accum_dtype`: \"fp32\" → `\"fp32\"`, the precision's own type → `\"working\"`"},
      {"communication_data_type", I, "",
       "the type DeepSpeed reduces gradients in; zerod reduces in the accumulation type (`grad_accum_dtype`)"},
      {"prescale_gradients", I, "", "where DeepSpeed divides by the rank count; zerod averages once, the same mean"},
      {"gradient_predivide_factor", I, "", "where DeepSpeed divides by the rank count; zerod averages once, the same mean"},
      {"gradient_allreduce_op", T, "",
       "\"mean\" (DeepSpeed's default, in any case) is zerod's average of the ranks' gradients; \"sum\" is refused"},
      {"disable_allgather", I, "", "DeepSpeed 0.19 reads it and uses it nowhere"},
      // ZeRO.
      {"zero_optimization.stage", T, "", "`zero.stage`"},
      {"zero_optimization.reduce_bucket_size", T, "", "`zero.reduce_bucket_size` (stages 2-3; ignored below, as DeepSpeed's stage 0)"},
      {"zero_optimization.stage3_param_persistence_threshold", T, "", "`zero.param_persistence_threshold` (stage 3)"},
      {"zero_optimization.param_persistence_threshold", T, "", "the same (DeepSpeed's alias)"},
      {"zero_optimization.stage3_max_live_parameters", T, "", "`zero.max_live_parameters` (stage 3)"},
      {"zero_optimization.max_live_parameters", T, "", "the same (DeepSpeed's alias)"},
      {"zero_optimization.stage3_prefetch_bucket_size", T, "", "`zero.prefetch_bucket_size` (stage 3)"},
      {"zero_optimization.prefetch_bucket_size", T, "", "the same (DeepSpeed's alias)"},
      {"zero_optimization.offload_optimizer.device", T, "", "`offload.optimizer`: none → \"device\", cpu → \"host\", nvme → \"nvme\""},
      {"zero_optimization.offload_optimizer.nvme_path", T, "", "`offload.nvme_path`"},
      {"zero_optimization.offload_optimizer.pin_memory", T, "", "`offload.host.pin` (the host tier page-locks its memory)"},
      {"zero_optimization.offload_optimizer.ratio", T, "", "`offload.ratio`"},
      {"zero_optimization.offload_optimizer.buffer_count", T, "", "`offload.buffer_count` (NVMe staging sets, at least 3)"},
      {"zero_optimization.offload_optimizer.pipeline_read", I, "", "zerod's NVMe pipeline always reads ahead"},
      {"zero_optimization.offload_optimizer.pipeline_write", I, "", "zerod's NVMe pipeline always writes behind"},
      {"zero_optimization.offload_optimizer.fast_init", I, "", "how DeepSpeed first fills its swap files"},
      {"zero_optimization.offload_param.device", T, "", "`offload.params`: none → \"device\", cpu → \"host\", nvme → \"nvme\" (stage 3)"},
      {"zero_optimization.offload_param.nvme_path", T, "", "`offload.nvme_path` (one path for both)"},
      {"zero_optimization.offload_param.pin_memory", T, "", "`offload.host.pin`"},
      {"zero_optimization.offload_param.buffer_count", I, "", "DeepSpeed's parameter swap buffers; zerod sizes its own"},
      {"zero_optimization.offload_param.buffer_size", I, "", "DeepSpeed's parameter swap buffers; zerod sizes its own"},
      {"zero_optimization.offload_param.max_in_cpu", I, "", "DeepSpeed's parameter swap buffers; zerod sizes its own"},
      {"zero_optimization.cpu_offload", T, "", "deprecated in DeepSpeed: true → `offload.optimizer = \"host\"`"},
      {"zero_optimization.cpu_offload_param", T, "",
       "deprecated in DeepSpeed: true → `offload.params = \"host\"` (stage 3)"},
      {"zero_optimization.cpu_offload_use_pin_memory", I, "", "deprecated in DeepSpeed; `offload_optimizer.pin_memory` says it"},
      {"zero_optimization.contiguous_gradients", I, "", kZeroTuning},
      {"zero_optimization.overlap_comm", I, "", kZeroTuning},
      {"zero_optimization.reduce_scatter", I, "", kZeroTuning},
      {"zero_optimization.allgather_partitions", I, "", kZeroTuning},
      {"zero_optimization.allgather_bucket_size", I, "", kZeroTuning},
      {"zero_optimization.use_multi_rank_bucket_allreduce", I, "", kZeroTuning},
      {"zero_optimization.round_robin_gradients", I, "", kZeroTuning},
      {"zero_optimization.sub_group_size", I, "", "DeepSpeed's optimizer step granularity; zerod's is `offload.tile_size`"},
      {"zero_optimization.stage3_max_reuse_distance", I, "", kZeroTuning},
      {"zero_optimization.stage3_model_persistence_threshold", I, "", kZeroTuning},
      {"zero_optimization.stage3_module_granularity_threshold", I, "", "zerod's fetch units are the trainer's modules (zerod.torch `modules=`)"},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params", I, "", kZeroTuning},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", I, "",
       "zerod's `state_dict()` and checkpoints always hold the whole model in fp32"},
      // DeepSpeed's own field names for the stage3_ keys above (its config
      // model takes either).
      {"zero_optimization.max_reuse_distance", I, "", kZeroTuning},
      {"zero_optimization.model_persistence_threshold", I, "", kZeroTuning},
      {"zero_optimization.module_granularity_threshold", I, "", "zerod's fetch units are the trainer's modules (zerod.torch `modules=`)"},
      {"zero_optimization.use_all_reduce_for_fetch_params", I, "", kZeroTuning},
      {"zero_optimization.gather_16bit_weights_on_model_save", I, "",
       "zerod's `state_dict()` and checkpoints always hold the whole model in fp32"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", I, "",
       "zerod's `state_dict()` and checkpoints always hold the whole model in fp32"},
      {"zero_optimization.load_from_fp32_weights", I, "", "zerod always loads the fp32 masters of a checkpoint"},
      {"zero_optimization.ignore_unused_parameters", I, "", "zerod gives an unused parameter a zero gradient always"},
      {"zero_optimization.elastic_checkpoint", I, "", "zerod's checkpoints load at any world size always"},
      {"zero_optimization.memory_efficient_linear", I, "", "a DeepSpeed ZeRO-3 linear layer; zerod.torch keeps torch's"},
      {"zero_optimization.log_trace_cache_warnings", I, "", kMonitor},
      {"zero_optimization.legacy_stage1", I, "", kZeroTuning},
      {"zero_optimization.zero_hpz_partition_size", D, "1", "ZeRO++ hierarchical partitions are not built"},
      {"zero_optimization.zero_quantized_weights", D, "false", "ZeRO++ quantized collectives are not built"},
      {"zero_optimization.zero_quantized_gradients", D, "false", "ZeRO++ quantized collectives are not built"},
      {"zero_optimization.zero_quantized_nontrainable_weights", D, "false", "ZeRO++ quantized collectives are not built"},
      {"zero_optimization.mics_shard_size", R, "", kRemoved},
      {"zero_optimization.mics_hierarchical_params_gather", R, "", kRemoved},
      {"zero_optimization.zeropp_loco_param", R, "", kRemoved},
      // What zerod does not do, with the one value that means "off".
      {"activation_checkpointing.partition_activations", D, "false", "zerod does not partition activations across ranks"},
      {"activation_checkpointing.cpu_checkpointing", D, "false", "zerod does not move checkpointed activations to the CPU"},
      {"activation_checkpointing.contiguous_memory_optimization", I, "",
       "DeepSpeed's activation-checkpointing API; checkpoint with torch.utils.checkpoint"},
      {"activation_checkpointing.synchronize_checkpoint_boundary", I, "",
       "DeepSpeed's activation-checkpointing API; checkpoint with torch.utils.checkpoint"},
      {"activation_checkpointing.number_checkpoints", I, "",
       "DeepSpeed's activation-checkpointing API; checkpoint with torch.utils.checkpoint"},
      {"activation_checkpointing.profile", I, "", kMonitor},
      {"autotuning.enabled", D, "false", "DeepSpeed's autotuner launches DeepSpeed jobs"},
      {"data_efficiency.enabled", D, "false", "DeepSpeed's data pipeline is not part of zerod"},
      {"hybrid_engine.enabled", D, "false", "DeepSpeed-Chat's inference engine is not part of zerod"},
      {"hybrid_engine.*", I, "", "DeepSpeed-Chat's inference engine settings, read only with hybrid_engine.enabled"},
      {"use_data_before_expert_parallelism", I, "",
       "the order of DeepSpeed's expert-parallel process groups; zerod has no expert parallelism"},
      // What DeepSpeed 0.19 itself refuses, with any value.
      {"elasticity", R, "", "DeepSpeed 0.19 removed elastic training and refuses the block"},
      {"curriculum_learning", R, "",
       "DeepSpeed 0.19 refuses the top-level block (its successor is data_efficiency's, which zerod does not run)"},
      {"compression_training", R, "", kRemoved},
      {"quantize_training", R, "", kRemoved},
      {"sparse_gradients", R, "", kRemoved},
      {"sparse_attention", R, "", kRemoved},
      {"eigenvalue", R, "", kRemoved},
      {"progressive_layer_drop", R, "", kRemoved},
      {"nebula", R, "", kRemoved},
      {"graph_harvesting", R, "", kRemoved},
      // Only DeepSpeed's own bookkeeping, logs and monitors.
      {"steps_per_print", I, "", "DeepSpeed's progress log; the trainer prints"},
      {"wall_clock_breakdown", I, "", kMonitor},
      {"dump_state", I, "", kMonitor},
      {"memory_breakdown", I, "", kMonitor},
      {"zero_allow_untested_optimizer", I, "", "DeepSpeed's check of client optimizers; zerod's optimizers are its plugins"},
      {"zero_force_ds_cpu_optimizer", I, "", "DeepSpeed's check of client optimizers; zerod's optimizers are its plugins"},
      {"aio.*", I, "", "DeepSpeed's libaio settings; zerod's nvme tier has its own (`offload.nvme`)"},
      {"checkpoint.*", I, "", "DeepSpeed's checkpoint tag checks; zerod's format is its own (checkpoints.md)"},
      {"flops_profiler.*", I, "", kMonitor},
      {"tensorboard.*", I, "", kMonitor},
      {"wandb.*", I, "", kMonitor},
      {"csv_monitor.*", I, "", kMonitor},
      {"comet.*", I, "", kMonitor},
      {"comms_logger.*", I, "", kMonitor},
  };
}

}  // namespace

const std::vector<DsKey>& deepspeed_keys() {
  static const std::vector<DsKey> keys = make_keys();
  return keys;
}

const DsKey* find_deepspeed_key(std::string_view key) {
  const DsKey* section = nullptr;
  for (const DsKey& k : deepspeed_keys()) {
    if (k.key == key) return &k;
    if (k.key.ends_with(".*")) {
      const auto prefix = k.key.substr(0, k.key.size() - 1);  // "aio."
      if (key.starts_with(prefix) || key == prefix.substr(0, prefix.size() - 1)) section = &k;
    }
  }
  return section;
}

std::vector<std::string_view> deepspeed_keys_under(std::string_view section) {
  std::vector<std::string_view> out;
  for (const DsKey& k : deepspeed_keys()) {
    std::string_view rest = k.key;
    if (!section.empty()) {
      if (!rest.starts_with(section) || rest.size() <= section.size() || rest[section.size()] != '.') continue;
      rest.remove_prefix(section.size() + 1);
    }
    rest = rest.substr(0, rest.find('.'));
    bool seen = false;
    for (auto o : out) seen = seen || o == rest;
    if (!seen) out.push_back(rest);
  }
  return out;
}

}  // namespace zerod::scripting
