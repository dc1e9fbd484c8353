// The DeepSpeed translation (scripting/ds_config.cpp) on the decisions it
// takes after DeepSpeed 0.19: what it accepts as DeepSpeed accepts it
// (redundant and overridden keys), what it refuses as DeepSpeed refuses it,
// and DeepSpeed 0.19's defaults written out. These run everywhere;
// tests/python/test_deepspeed_configs.py holds the same translation to
// DeepSpeed itself over a corpus of real configs where the venv is.
#include "ds_config.h"
#include "error.h"
#include "job_script.h"

#include <gtest/gtest.h>

#include <string>

using namespace zerod::scripting;

namespace {

std::string lua(const std::string& json, int world = 1) {
  DsOptions o;
  o.world_size = world;
  return translate_deepspeed(json, "c.json", o).lua;
}

// The refusal's text (every problem, one per line), or "" when accepted.
std::string refusal(const std::string& json, int world = 1) {
  try {
    lua(json, world);
  } catch (const zerod::Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_CONFIG);
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string kBatch = R"("train_micro_batch_size_per_gpu": 4, )";

}  // namespace

TEST(DsConfig, AdamWModeWithAdamWIsRedundantOrOverriddenAsInDeepSpeed) {
  // Accelerate's test configs: AdamW with torch_adam and adam_w_mode true.
  const std::string both = lua("{" + kBatch + R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-4,
      "torch_adam": true, "adam_w_mode": true}}})");
  EXPECT_TRUE(has(both, R"(type = "adamw")")) << both;
  // false: DeepSpeed's engine runs AdamW still (the type decides); so does
  // the job, and it says so.
  const std::string off = lua("{" + kBatch + R"("optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})");
  EXPECT_TRUE(has(off, R"(type = "adamw")")) << off;
  EXPECT_TRUE(has(off, "adam_w_mode: false is ignored with type AdamW, as DeepSpeed ignores it")) << off;
  // With Adam it picks the weight decay.
  EXPECT_TRUE(has(lua("{" + kBatch + R"("optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"),
                  R"(type = "adam")"));
  // Any other optimizer is handed it by DeepSpeed and refuses it.
  const std::string sgd = refusal("{" + kBatch + R"("optimizer": {"type": "SGD", "params": {"lr": 0.1,
      "adam_w_mode": true, "torch_adam": true}}})");
  EXPECT_TRUE(has(sgd, "optimizer.params.adam_w_mode: applies to Adam and AdamW only")) << sgd;
  EXPECT_TRUE(has(sgd, "optimizer.params.torch_adam: applies to Adam and AdamW only")) << sgd;
}

TEST(DsConfig, WhatDeepSpeed019RefusesIsRefusedNamingTheKey) {
  for (const std::string& key : {std::string(R"("amp": {"enabled": false})"), std::string(R"("elasticity": {})"),
                                 std::string(R"("curriculum_learning": {"enabled": true})"),
                                 std::string(R"("sparse_attention": null)")}) {
    const std::string why = refusal("{" + kBatch + key + "}");
    const std::string name = key.substr(1, key.find('"', 1) - 1);
    EXPECT_TRUE(has(why, "c.json:1: " + name + ": is refused, as DeepSpeed 0.19 refuses it")) << why;
  }
  const std::string mics = refusal("{" + kBatch + R"("zero_optimization": {"stage": 3, "mics_shard_size": 8}})");
  EXPECT_TRUE(has(mics, "zero_optimization.mics_shard_size: is refused, as DeepSpeed 0.19 refuses it")) << mics;
  const std::string norm = refusal("{" + kBatch + R"("optimizer": {"type": "Adam", "params": {"max_grad_norm": 1}}})");
  EXPECT_TRUE(has(norm, "optimizer.params.max_grad_norm: is refused")) << norm;
  EXPECT_TRUE(has(refusal("{" + kBatch + R"("optimizer": {"type": "sgd"}})"), "DeepSpeed takes SGD by torch.optim's name"));
  // A leftover parameter DeepSpeed's scheduler class refuses.
  EXPECT_TRUE(has(refusal("{" + kBatch + R"("scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 9}}})"),
                  "scheduler.params.total_num_steps: is not a parameter of DeepSpeed's WarmupLR"));
}

// Keys DeepSpeed 0.19.8 reads that a config may spell out at their defaults:
// accepted at what zerod does, refused otherwise with the reason.
TEST(DsConfig, DeepSpeed0198KeysAtWhatZerodDoesAreAccepted) {
  const std::string ok = lua("{" + kBatch + R"("torch_autocast": {"enabled": false, "dtype": "bfloat16"},
      "managed_gradient_accumulation": true, "gradient_allreduce_op": "MEAN", "disable_allgather": true,
      "use_data_before_expert_parallelism": true})");
  for (const char* ignored : {"torch_autocast.dtype: accepted and ignored", "disable_allgather: accepted and ignored",
                              "use_data_before_expert_parallelism: accepted and ignored"})
    EXPECT_TRUE(has(ok, ignored)) << ok;
  EXPECT_TRUE(has(refusal("{" + kBatch + R"("torch_autocast": {"enabled": true}})"),
                  "c.json:1: torch_autocast.enabled: is true, which zerod does not support: zerod does not wrap the "
                  "forward in torch.autocast"));
  EXPECT_TRUE(has(refusal("{" + kBatch + R"("managed_gradient_accumulation": false})"),
                  "managed_gradient_accumulation: is false, which zerod does not support: zerod ends an "
                  "accumulation window"));
  EXPECT_TRUE(has(refusal("{" + kBatch + R"("gradient_allreduce_op": "sum"})"),
                  R"(gradient_allreduce_op: "sum" is refused: zerod averages the ranks' gradients)"));
  EXPECT_TRUE(has(refusal("{" + kBatch + R"("gradient_allreduce_op": "max"})"),
                  R"(gradient_allreduce_op: must be "mean" or "sum", as DeepSpeed requires, got "max")"));
}

TEST(DsConfig, AnotherOptimizersParametersAreNotReportedOneByOne) {
  const std::string why = refusal("{" + kBatch + R"("optimizer": {"type": "Lamb", "params": {"max_coeff": 0.3}}})");
  EXPECT_TRUE(has(why, R"(optimizer.type: "Lamb" has no zerod optimizer plugin)")) << why;
  EXPECT_FALSE(has(why, "max_coeff")) << why;
}

TEST(DsConfig, DeepSpeed019DefaultsAreWrittenOut) {
  // Clipping at 1.0 unless told.
  EXPECT_TRUE(has(lua("{" + kBatch + "}"), "gradient_clipping = 1,"));
  EXPECT_FALSE(has(lua("{" + kBatch + R"("gradient_clipping": 0})"), "gradient_clipping ="));
  // Offloaded memory is pinned unless pin_memory is false.
  EXPECT_TRUE(has(lua("{" + kBatch + R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})"),
                  "host = { pin = true }"));
  EXPECT_TRUE(has(lua("{" + kBatch + R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
      "pin_memory": false}}})"), "host = { pin = false }"));
}

// An "auto" gradient_clipping run as written (zerod run --job with Hugging
// Face's config): DeepSpeed's default for the key, 1.0, not zerod's (no
// clipping). zerod check still takes the config, as the trainer fills it in.
TEST(DsConfig, AnUnfilledAutoClippingIsDeepSpeedsDefault) {
  const std::string job = lua("{" + kBatch + R"("gradient_clipping": "auto"})");
  EXPECT_TRUE(has(job, "\n  gradient_clipping = 1,  -- DeepSpeed 0.19's default")) << job;
  EXPECT_TRUE(has(job, R"(-- gradient_clipping: "auto", left at the default here)")) << job;
}

// "torch_adam": DeepSpeed builds torch.optim.AdamW (type AdamW, or Adam with
// adam_w_mode true, its default), whose weight decay defaults to 0.01, or
// torch.optim.Adam (Adam with adam_w_mode false), whose default is 0.
TEST(DsConfig, TorchAdamDecaysAsTorchsOptimizerDoes) {
  auto job = [](const std::string& type, const std::string& more) {
    return lua("{" + kBatch + R"("optimizer": {"type": ")" + type + R"(", "params": {"lr": 1e-4, "torch_adam": true)" +
               more + "}}}");
  };
  for (const std::string& adamw : {job("AdamW", ""), job("Adam", ""), job("Adam", R"(, "adam_w_mode": true)"),
                                   job("AdamW", R"(, "adam_w_mode": false)")}) {
    EXPECT_TRUE(has(adamw, R"(type = "adamw")")) << adamw;
    EXPECT_TRUE(has(adamw, "weight_decay = 0.01,  -- torch.optim.AdamW's default")) << adamw;
  }
  const std::string adam = job("Adam", R"(, "adam_w_mode": false)");
  EXPECT_TRUE(has(adam, R"(type = "adam")")) << adam;
  EXPECT_TRUE(has(adam, "weight_decay = 0,")) << adam;
  // A weight_decay given is the one, and DeepSpeed's own kernels default to 0.
  EXPECT_TRUE(has(job("AdamW", R"(, "weight_decay": 0.1)"), "weight_decay = 0.1,"));
  EXPECT_FALSE(has(job("AdamW", R"(, "weight_decay": 0.1)"), "0.01"));
  EXPECT_TRUE(has(lua("{" + kBatch + R"("optimizer": {"type": "AdamW", "params": {"torch_adam": false}}})"),
                  "weight_decay = 0,"));
}

TEST(DsConfig, AnOptimizerWithoutLrRunsAtDeepSpeedsDefault) {
  // DeepSpeed builds torch.optim.SGD(params, momentum=0.9): lr 1e-3, where
  // zerod's sgd plugin would take 1e-2. Adam and AdamW default to 1e-3 too.
  const std::string sgd = lua("{" + kBatch + R"("optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})");
  EXPECT_TRUE(has(sgd, "    lr = 0.001,  -- DeepSpeed 0.19's default")) << sgd;
  EXPECT_TRUE(has(lua("{" + kBatch + R"("optimizer": {"type": "AdamW"}})"), "    lr = 0.001,"));
  const std::string given = lua("{" + kBatch + R"("optimizer": {"type": "SGD", "params": {"lr": 0.1}}})");
  EXPECT_TRUE(has(given, "    lr = 0.1,")) << given;
  EXPECT_FALSE(has(given, "lr = 0.001")) << given;
}

TEST(DsConfig, OneCycleStairsAsDeepSpeedCountsThem) {
  const std::string base = "{" + kBatch + R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
      "cycle_max_lr": 0.01, "cycle_first_step_size": 10, "cycle_momentum": false)";
  // The second half's count defaults to the first's.
  const std::string one = lua(base + R"(, "cycle_first_stair_count": 5}}})");
  EXPECT_TRUE(has(one, "first_stairs = 5, second_stairs = 5 }")) << one;
  const std::string two = lua(base + R"(, "cycle_first_stair_count": 0, "cycle_second_stair_count": 4}}})");
  EXPECT_TRUE(has(two, "first_stairs = 0, second_stairs = 4 }")) << two;
  // 0 (DeepSpeed's default) is the continuous ramp: nothing to write.
  const std::string none = lua(base + R"(, "cycle_first_stair_count": 0}}})");
  EXPECT_FALSE(has(none, "stairs")) << none;
  EXPECT_TRUE(has(refusal(base + R"(, "cycle_first_stair_count": 2.5}}})"),
                  "scheduler.params.cycle_first_stair_count: must be a whole number >= 0"));
}

TEST(DsConfig, Fp16HasNoHysteresisWithoutZeroAsInDeepSpeed) {
  const std::string fp16 = R"("fp16": {"enabled": true, "hysteresis": 3, "consecutive_hysteresis": true}, )";
  const std::string s0 = lua("{" + kBatch + fp16 + R"("zero_optimization": {"stage": 0}})");
  EXPECT_TRUE(has(s0, "hysteresis = 1,")) << s0;
  EXPECT_FALSE(has(s0, "consecutive_hysteresis = true")) << s0;
  EXPECT_TRUE(has(s0, "not used at ZeRO stage 0")) << s0;
  const std::string s2 = lua("{" + kBatch + fp16 + R"("zero_optimization": {"stage": 2}})");
  EXPECT_TRUE(has(s2, "hysteresis = 3,")) << s2;
  EXPECT_TRUE(has(s2, "consecutive_hysteresis = true,")) << s2;
  // DeepSpeed 0.19 starts at 2^16 like zerod: nothing to write.
  EXPECT_FALSE(has(lua("{" + kBatch + R"("fp16": {"enabled": true}, "zero_optimization": {"stage": 1}})"),
                   "initial_scale_power"));
}

// DeepSpeed's ZeRO optimizers (DynamicLossScaler) raise at an overflow at
// the minimum scale; its fp16 optimizer without ZeRO (_update_scale) keeps
// skipping. No config key sets it.
TEST(DsConfig, Fp16StopsAtTheMinimumScaleOnlyWithZeroAsInDeepSpeed) {
  const std::string fp16 = R"("fp16": {"enabled": true}, )";
  const std::string s0 = lua("{" + kBatch + fp16 + R"("zero_optimization": {"stage": 0}})");
  EXPECT_TRUE(has(s0, "raise_error_at_min_scale = false,")) << s0;
  const std::string s2 = lua("{" + kBatch + fp16 + R"("zero_optimization": {"stage": 2}})");
  EXPECT_FALSE(has(s2, "raise_error_at_min_scale")) << s2;
}

TEST(DsConfig, OffloadBelowItsStageIsIgnoredAsInDeepSpeed) {
  // DeepSpeed-Chat writes offload_param at every stage; DeepSpeed reads it at 3.
  const std::string s2 = lua("{" + kBatch + R"("zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"},
      "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_FALSE(has(s2, "params = ")) << s2;
  EXPECT_TRUE(has(s2, R"(optimizer = "host")")) << s2;
  EXPECT_TRUE(has(s2, "zero_optimization.offload_param: ignored at ZeRO stage 2, as DeepSpeed ignores it")) << s2;
  // A partial offload is refused below stage 3, as DeepSpeed refuses it.
  EXPECT_TRUE(has(refusal("{" + kBatch + R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
      "ratio": 0.3}}})"), "zero_optimization.offload_optimizer.ratio: a partial offload"));
  // The deprecated booleans still work.
  const std::string old = lua("{" + kBatch + R"("zero_optimization": {"stage": 3, "cpu_offload": true,
      "cpu_offload_param": true}})");
  EXPECT_TRUE(has(old, R"(optimizer = "host")") && has(old, R"(params = "host")")) << old;
}

TEST(DsConfig, SchedulersAsDeepSpeedMakesThem) {
  const std::string opt = R"("optimizer": {"type": "AdamW", "params": {"lr": 0.02}}, )";
  // WarmupLR's maximum is the optimizer's lr; WarmupDecayLR's is 0.001.
  EXPECT_TRUE(has(lua("{" + kBatch + opt + R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}})"),
                  "max_lr = 0.02"));
  EXPECT_TRUE(has(lua("{" + kBatch + opt + R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 9,
      "warmup_num_steps": 5}}})"), "max_lr = 0.001"));
  EXPECT_TRUE(has(refusal("{" + kBatch + opt + R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})"),
                  "scheduler.params.warmup_num_steps: must be a whole number >= 1"));
  const std::string range = lua("{" + kBatch + opt + R"("scheduler": {"type": "LRRangeTest", "params": {
      "lr_range_test_min_lr": 0.0001, "lr_range_test_step_size": 10, "lr_range_test_step_rate": 5,
      "lr_range_test_staircase": true}}})");
  EXPECT_TRUE(has(range, "lr = function(t) return 0.0001 * (1 + 5 * math.floor(t / 10)) end")) << range;
  // A schedule the trainer has yet to fill in: no lr in the job, and why.
  const std::string later = lua("{" + kBatch + opt + R"("scheduler": {"type": "WarmupDecayLR", "params": {
      "total_num_steps": "auto", "warmup_num_steps": "auto"}}})");
  EXPECT_FALSE(has(later, "\n  lr = ")) << later;
  EXPECT_TRUE(has(later, "WarmupDecayLR is built when the trainer fills in scheduler.params.total_num_steps")) << later;
}

TEST(DsConfig, BatchSizesAsDeepSpeedChecksThem) {
  // Neither size: DeepSpeed refuses to start.
  EXPECT_TRUE(has(refusal(R"({"gradient_accumulation_steps": 4})", 2), "neither train_batch_size nor"));
  // train_batch_size alone is one micro-batch per rank per step.
  EXPECT_TRUE(has(refusal(R"({"train_batch_size": 16})", 3), "16 is not a whole multiple"));
  EXPECT_EQ(refusal(R"({"train_batch_size": 16})", 4), "");
}

// train_batch_size and the micro-batch without the accumulation steps: the
// steps are train_batch_size / (micro-batch × ranks), as DeepSpeed derives
// them, when the rank count is known (zerod run and serve pass it); without
// it the refusal names how to give it where it is read.
TEST(DsConfig, AccumulationStepsFromTheRankCount) {
  const std::string cfg = R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})";
  EXPECT_TRUE(has(lua(cfg, 2), "gradient_accumulation_steps = 2,")) << lua(cfg, 2);
  EXPECT_FALSE(has(lua(cfg, 4), "gradient_accumulation_steps")) << lua(cfg, 4);  // 1, the default
  EXPECT_TRUE(has(refusal(R"({"train_batch_size": 18, "train_micro_batch_size_per_gpu": 4})", 2),
                  "train_batch_size: 18 is not a whole multiple of train_micro_batch_size_per_gpu (4) × 2 ranks"));
  EXPECT_TRUE(has(refusal(cfg, 8), "16 is not a whole multiple of train_micro_batch_size_per_gpu (4) × 8 ranks"));
  const std::string unknown = refusal(cfg, 0);
  EXPECT_TRUE(has(unknown, "give gradient_accumulation_steps too (zerod run and zerod serve know the rank count; "
                           "zerod check and zerod translate take it as --world-size N)")) << unknown;
  DsOptions o;
  o.world_size_option = "--nproc R";
  try {
    translate_deepspeed(cfg, "c.json", o);
    ADD_FAILURE() << "accepted without the rank count";
  } catch (const zerod::Error& e) {
    EXPECT_TRUE(has(e.what(), "give gradient_accumulation_steps too, or the rank count with --nproc R")) << e.what();
  }
}

// A DeepSpeed config's resolved settings name the config's lines, not the
// translated script's; the derived steps name train_batch_size's.
TEST(DsConfig, ResolvedSettingsNameTheConfigsLines) {
  ScriptSource src;
  src.text = "{\n\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},\n\n"
             "\"train_batch_size\": 16,\n\"train_micro_batch_size_per_gpu\": 4,\n\"zero_optimization\": {\"stage\": 2}\n}";
  src.name = "c.json";
  src.world_size = 2;
  const auto job = JobScript::load(src);
  EXPECT_EQ(job->config().gradient_accumulation_steps, 2);
  int steps_line = -1, stage_line = -1, clip_line = -1;
  for (const ResolvedValue& v : job->resolved()) {
    if (v.key == "gradient_accumulation_steps") steps_line = v.line;
    if (v.key == "zero.stage") stage_line = v.line;
    if (v.key == "gradient_clipping") clip_line = v.line;
  }
  EXPECT_EQ(steps_line, 4);
  EXPECT_EQ(stage_line, 6);
  EXPECT_EQ(clip_line, 0);  // DeepSpeed's default, written from no key of the config
}

TEST(DsConfig, TheOlderBfloat16NameIsBf16) {
  EXPECT_TRUE(has(lua("{" + kBatch + R"("bfloat16": {"enabled": true}})"), R"(precision = "bf16")"));
  // bf16 wins where both are given, as in DeepSpeed.
  EXPECT_FALSE(has(lua("{" + kBatch + R"("bf16": {"enabled": false}, "bfloat16": {"enabled": true}})"), "precision"));
}
