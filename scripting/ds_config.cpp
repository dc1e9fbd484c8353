// DeepSpeed JSON config -> zerod Lua job script. The JSON is parsed by
// protobuf's JSON parser into a google.protobuf.Struct; every key is then
// looked up in ds_keys.cpp's table (translated, ignored, or accepted only at
// DeepSpeed's default), so a key this file does not handle is refused.
// Values keep DeepSpeed 0.19's semantics: its defaults where zerod's differ
// (weight_decay 0, Adam = AdamW, pinned offload memory), its fp16 scaler
// (no hysteresis, nor a stop at the minimum scale, without ZeRO), its
// batch-size rule, its schedulers' defaults and one-step lag (the first
// update runs at the lr the scheduler set when it was made), and what it
// accepts and ignores: a redundant or
// overridden key (adam_w_mode with AdamW, offload_param below stage 3) is
// accepted as DeepSpeed accepts it, and said in a comment of the job.
// tests/python/test_deepspeed_configs.py holds the translation to DeepSpeed's
// own parser and engine over a corpus of configs as users have them.
#include "ds_config.h"

#include <zerod/kit/text.h>

#include "ds_keys.h"
#include "error.h"
#include "job_schema.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace zerod::scripting {

using google::protobuf::Struct;
using google::protobuf::Value;

namespace {

std::string lua_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// A value as JSON would write it, for messages.
std::string json_text(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNumberValue: return format_number(v.number_value());
    case Value::kBoolValue: return v.bool_value() ? "true" : "false";
    case Value::kStringValue: return "\"" + v.string_value() + "\"";
    case Value::kNullValue: return "null";
    case Value::kListValue: return "a list";
    default: return "an object";
  }
}

// The lr DeepSpeed 0.19's optimizers take when the config gives none
// (Translator::optimizer), and so what its schedulers start from.
constexpr double kDeepSpeedDefaultLr = 1e-3;

// DeepSpeed's optimizer types zerod translates, lower-cased (DeepSpeed
// matches its own names in any case), and the plugin each becomes.
const std::map<std::string, std::string>& optimizer_plugins() {
  static const std::map<std::string, std::string> names = {
      {"adam", "adamw"}, {"adamw", "adamw"}, {"onebitadam", "onebit_adam"}, {"sgd", "sgd"}};
  return names;
}

std::string lower_case(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// One line of the job script, and the config key it came from.
struct Out {
  std::string text;
  std::string from;
};

class Translator {
 public:
  Translator(const std::string& json, std::string source, DsOptions opt)
      : json_(json), source_(std::move(source)), opt_(opt) {}

  DsTranslation run(const Struct& root);

 private:
  // -- looking at the config -------------------------------------------------
  const Value* get(const Struct& s, const std::string& key) const {
    auto it = s.fields().find(key);
    if (it == s.fields().end() || it->second.kind_case() == Value::kNullValue) return nullptr;
    return &it->second;
  }
  const Struct* section(const Struct& s, const std::string& key, const std::string& path) {
    const Value* v = get(s, key);
    if (!v) return nullptr;
    if (v->kind_case() != Value::kStructValue) {
      issue(path, "must be an object, got " + json_text(*v));
      return nullptr;
    }
    return &v->struct_value();
  }
  static bool is_auto(const Value* v) { return v && v->kind_case() == Value::kStringValue && v->string_value() == "auto"; }
  std::optional<double> number(const Struct& s, const std::string& key, const std::string& path) {
    const Value* v = get(s, key);
    if (!v) return std::nullopt;
    if (is_auto(v)) {
      autos_.push_back(path);
      return std::nullopt;
    }
    if (v->kind_case() != Value::kNumberValue) {
      issue(path, "must be a number, got " + json_text(*v));
      return std::nullopt;
    }
    return v->number_value();
  }
  std::optional<bool> boolean(const Struct& s, const std::string& key, const std::string& path) {
    const Value* v = get(s, key);
    if (!v) return std::nullopt;
    if (is_auto(v)) {
      autos_.push_back(path);
      return std::nullopt;
    }
    if (v->kind_case() != Value::kBoolValue) {
      issue(path, "must be true or false, got " + json_text(*v));
      return std::nullopt;
    }
    return v->bool_value();
  }
  std::optional<std::string> string(const Struct& s, const std::string& key, const std::string& path) {
    const Value* v = get(s, key);
    if (!v) return std::nullopt;
    if (v->kind_case() != Value::kStringValue) {
      issue(path, "must be a string, got " + json_text(*v));
      return std::nullopt;
    }
    return v->string_value();
  }

  // Every key of `s` (at `path`) is checked against the table: unknown keys
  // and keys accepted only at their default are reported here.
  void check_keys(const Struct& s, const std::string& path);

  // -- reporting -------------------------------------------------------------
  int line_of(const std::string& path) const;
  void issue(const std::string& path, const std::string& why) { issues_.push_back({line_of(path), path + ": " + why}); }

  // -- writing the job -------------------------------------------------------
  void emit(int depth, const std::string& text, const std::string& from = "") {
    out_.push_back({std::string(static_cast<size_t>(depth) * 2, ' ') + text, from});
  }
  // `key = value,` with the value of a DeepSpeed number, in the job when it
  // differs from the schema's default for zkey (or always, for a plugin's
  // hyperparameter: zkey empty), checked against the schema's range.
  void number_setting(int depth, const std::string& key, double v, const std::string& from, std::string_view zkey = "");

  void batch_sizes(const Struct& root);
  void gradient_reduction(const Struct& root);
  void precision(const Struct& root);
  void zero(const Struct& root);
  void optimizer(const Struct& root);
  void scheduler(const Struct& root);

  const std::string& json_;
  std::string source_;
  DsOptions opt_;
  std::vector<std::pair<int, std::string>> issues_;
  std::vector<std::string> autos_;     // keys given as "auto", left at the default
  std::vector<std::string> comments_;  // said at the top of the script
  std::vector<Out> out_;
  // The optimizer's lr as Lua text and as a number (schedulers default to it).
  std::string opt_lr_ = format_number(kDeepSpeedDefaultLr);
  double opt_lr_value_ = kDeepSpeedDefaultLr;
  const Struct* zero_ = nullptr;       // the zero_optimization section, when given
  bool untranslated_optimizer_ = false; // optimizer.type is refused: its params are not checked one by one
  int stage_ = 0;                      // its stage (read first: precision depends on it)
};

int Translator::line_of(const std::string& path) const {
  // The text position of each component in turn: a key is found after its
  // parent's name, which is enough for configs as people write them.
  size_t pos = 0;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string name = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const size_t at = json_.find("\"" + name + "\"", pos);
    if (at == std::string::npos) break;
    pos = at;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return 1 + static_cast<int>(std::count(json_.begin(), json_.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

void Translator::check_keys(const Struct& s, const std::string& path) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : s.fields()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());  // protobuf's map has no order; messages should
  for (const std::string& k : keys) {
    const std::string full = path.empty() ? k : path + "." + k;
    const Value& v = s.fields().at(k);
    // Another optimizer's parameters are DeepSpeed keys too; the type's
    // refusal says all there is to say.
    if (full == "optimizer.params" && untranslated_optimizer_) continue;
    const DsKey* rule = find_deepspeed_key(full);
    const auto under = deepspeed_keys_under(full);
    // A section: its keys in turn (a "section.*" rule covers the ones not named).
    const bool names_keys = std::any_of(under.begin(), under.end(), [](std::string_view u) { return u != "*"; });
    if ((!rule || rule->key.ends_with(".*")) && names_keys) {
      if (v.kind_case() == Value::kStructValue) check_keys(v.struct_value(), full);
      continue;
    }
    if (!rule) {
      std::string best;
      size_t best_d = 3;
      for (auto cand : deepspeed_keys_under(path)) {
        if (cand == "*") continue;
        const size_t d = edit_distance(k, cand);
        if (d < best_d && d <= std::max<size_t>(1, cand.size() / 3)) {
          best_d = d;
          best = std::string(cand);
        }
      }
      issue(full, "is not a DeepSpeed key zerod knows" +
                      (best.empty() ? std::string("; docs/integrations.md lists the ones it translates or ignores")
                                    : " (did you mean '" + (path.empty() ? best : path + "." + best) + "'?)"));
      continue;
    }
    if (rule->kind == DsKey::kDefaultOnly && v.kind_case() != Value::kNullValue && json_text(v) != rule->value)
      issue(full, "is " + json_text(v) + ", which zerod does not support: " + std::string(rule->note) +
                      " (only " + std::string(rule->value) + " is accepted)");
    if (rule->kind == DsKey::kRefusedByDeepSpeed)
      issue(full, "is refused, as DeepSpeed 0.19 refuses it: " + std::string(rule->note));
    if (rule->kind == DsKey::kIgnored)
      comments_.push_back(full + ": accepted and ignored (" + std::string(rule->note) + ")");
  }
}

void Translator::number_setting(int depth, const std::string& key, double v, const std::string& from,
                                std::string_view zkey) {
  if (!zkey.empty()) {
    const KeySpec& k = job_key(zkey);
    const NumberRange& r = k.range;
    std::string bad;
    if (r.integer && v != std::floor(v)) bad = "must be a whole number";
    else if (r.min_exclusive ? !(v > r.min) : !(v >= r.min))
      bad = std::string("must be ") + (r.min_exclusive ? "> " : ">= ") + format_number(r.min);
    else if (!(v <= r.max)) bad = "must be <= " + format_number(r.max);
    if (!bad.empty()) {
      issue(from, bad + ", got " + format_number(v) + " (zerod's " + std::string(zkey) + ")");
      return;
    }
    if (v == k.def) return;  // the schema's default: nothing to write
  }
  emit(depth, key + " = " + format_number(v) + ",", from);
}

// DeepSpeed's rule (runtime/config.py): two of the three determine the
// third; all three must agree. Only the accumulation steps reach zerod.
void Translator::batch_sizes(const Struct& root) {
  const auto tbs = number(root, "train_batch_size", "train_batch_size");
  const auto mbs = number(root, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu");
  const auto gas = number(root, "gradient_accumulation_steps", "gradient_accumulation_steps");
  for (auto [v, key] : {std::pair{tbs, "train_batch_size"}, std::pair{mbs, "train_micro_batch_size_per_gpu"},
                        std::pair{gas, "gradient_accumulation_steps"}})
    if (v && (*v < 1 || *v != std::floor(*v))) {
      issue(key, "must be a whole number >= 1, got " + format_number(*v));
      return;
    }
  const double world = opt_.world_size;
  std::optional<double> steps = gas;
  if (tbs && mbs && gas) {
    const double per_rank = *mbs * *gas;
    if (world > 0 ? *tbs != per_rank * world : std::fmod(*tbs, per_rank) != 0)
      issue("train_batch_size",
            format_number(*tbs) + " is not train_micro_batch_size_per_gpu (" + format_number(*mbs) +
                ") × gradient_accumulation_steps (" + format_number(*gas) + ") × " +
                (world > 0 ? format_number(world) + " ranks" : std::string("a whole number of ranks")) +
                ", as DeepSpeed requires");
    else if (world == 0)
      comments_.push_back("the batch sizes imply " + format_number(*tbs / per_rank) + " rank(s)");
  } else if (tbs && mbs) {
    if (world > 0) {
      steps = *tbs / *mbs / world;
      if (*steps < 1 || *steps != std::floor(*steps)) {
        issue("train_batch_size", format_number(*tbs) + " is not a whole multiple of train_micro_batch_size_per_gpu (" +
                                      format_number(*mbs) + ") × " + format_number(world) + " ranks");
        steps.reset();
      }
    } else if (*tbs == *mbs) {
      steps = 1;
    } else {
      issue("train_batch_size",
            "with train_micro_batch_size_per_gpu and without gradient_accumulation_steps, the accumulation "
            "steps (train_batch_size / micro-batch / ranks) depend on the number of ranks, which this config "
            "alone does not say: give gradient_accumulation_steps too" +
                (!opt_.world_size_option.empty()
                     ? ", or the rank count with " + opt_.world_size_option
                     : std::string(" (zerod run and zerod serve know the rank count; zerod check and zerod "
                                   "translate take it as --world-size N)")));
    }
  } else if (tbs && world > 0 && std::fmod(*tbs, gas.value_or(1) * world) != 0) {
    // train_batch_size alone means one micro-batch per step (DeepSpeed sets
    // the accumulation steps to 1): it must split evenly over the ranks.
    issue("train_batch_size", format_number(*tbs) + " is not a whole multiple of gradient_accumulation_steps (" +
                                  format_number(gas.value_or(1)) + (gas ? "" : ", DeepSpeed's default") + ") × " +
                                  format_number(world) + " ranks");
  }
  if (!tbs && !mbs && !is_auto(get(root, "train_batch_size")) && !is_auto(get(root, "train_micro_batch_size_per_gpu")))
    issue("train_batch_size", "neither train_batch_size nor train_micro_batch_size_per_gpu is given: give one (DeepSpeed "
                              "refuses a config without both too)");
  // Derived steps come from train_batch_size's line (zerod check names it).
  if (steps)
    number_setting(1, "gradient_accumulation_steps", *steps, gas ? "gradient_accumulation_steps" : "train_batch_size",
                   "gradient_accumulation_steps");
  // An "auto" no trainer filled in is DeepSpeed's default too, not zerod's
  // (no clipping): DeepSpeed itself has no value for it (its first step
  // compares the text with 0.0 and raises a TypeError), and this
  // translation cannot tell a config a trainer fills in later (zerod check,
  // the integrations, which resolve every "auto" first) from one run as it
  // is (zerod run --job), so it leaves this "auto", as every other, at
  // DeepSpeed's default: 1.0, also what Hugging Face fills in from its own
  // default max_grad_norm.
  if (auto clip = number(root, "gradient_clipping", "gradient_clipping"))
    number_setting(1, "gradient_clipping", *clip, "gradient_clipping", "gradient_clipping");
  else if (const Value* given = get(root, "gradient_clipping"); !given || is_auto(given))
    emit(1, "gradient_clipping = 1,  -- DeepSpeed 0.19's default: it clips at 1.0 unless told otherwise",
         given ? "gradient_clipping" : "");
}

void Translator::precision(const Struct& root) {
  const Struct* fp16 = section(root, "fp16", "fp16");
  // DeepSpeed reads "bfloat16", its older name, where "bf16" is absent.
  const std::string bf = get(root, "bf16") || !get(root, "bfloat16") ? "bf16" : "bfloat16";
  const Struct* bf16 = section(root, bf, bf);
  const bool half = fp16 && boolean(*fp16, "enabled", "fp16.enabled").value_or(false);
  const bool brain = bf16 && boolean(*bf16, "enabled", bf + ".enabled").value_or(false);
  if (half && brain) {
    issue(bf + ".enabled", "fp16 and bf16 cannot both be enabled (DeepSpeed refuses it too)");
    return;
  }
  if (brain) emit(1, "precision = \"bf16\",", bf + ".enabled");
  if (half) {
    emit(1, "precision = \"fp16\",", "fp16.enabled");
    emit(1, "fp16 = {", "fp16");
    // DeepSpeed 0.19's scaler defaults (2^16, window 1000, hysteresis 2,
    // min 1) are zerod's: only what differs is written.
    for (const char* k : {"loss_scale", "initial_scale_power", "loss_scale_window", "min_loss_scale"})
      if (auto v = number(*fp16, k, std::string("fp16.") + k))
        number_setting(2, k, *v, std::string("fp16.") + k, "fp16." + std::string(k));
    // DeepSpeed doubles the scale an update later than torch's GradScaler
    // (zerod's default). zerod's own key picks the GradScaler's rule, for
    // configs zerod's integrations make from a GradScaler (zerod/_amp.py).
    const auto rule = string(*fp16, "zerod_window_rule", "fp16.zerod_window_rule");
    if (rule && *rule != "torch" && *rule != "deepspeed")
      issue("fp16.zerod_window_rule", "\"" + *rule + "\" is neither \"torch\" nor \"deepspeed\"");
    else if (!rule || *rule == "deepspeed")
      emit(2, "window_rule = \"deepspeed\",  -- DeepSpeed's DynamicLossScaler doubles an update later than torch's",
           "fp16.enabled");
    const auto hysteresis = number(*fp16, "hysteresis", "fp16.hysteresis");
    const auto consecutive = boolean(*fp16, "consecutive_hysteresis", "fp16.consecutive_hysteresis");
    if (stage_ == 0) {
      // Without ZeRO DeepSpeed's fp16 optimizers (FP16_Optimizer and its
      // unfused twin, _update_scale) halve the scale at every overflow:
      // their scaler has no hysteresis, whatever the config says.
      emit(2, "hysteresis = 1,  -- DeepSpeed's fp16 optimizer without ZeRO has no hysteresis", "fp16.enabled");
      // Nor does it stop at the minimum scale (its ZeRO optimizers'
      // DynamicLossScaler raises there, as zerod does by default).
      emit(2, "raise_error_at_min_scale = false,  -- DeepSpeed's fp16 optimizer without ZeRO keeps skipping there",
           "fp16.enabled");
      if (hysteresis || consecutive)
        comments_.push_back("fp16.hysteresis, fp16.consecutive_hysteresis: not used at ZeRO stage 0, as DeepSpeed's "
                            "fp16 optimizer without ZeRO does not use them (it halves the scale at every overflow)");
    } else {
      if (hysteresis) number_setting(2, "hysteresis", *hysteresis, "fp16.hysteresis", "fp16.hysteresis");
      if (consecutive && *consecutive) emit(2, "consecutive_hysteresis = true,", "fp16.consecutive_hysteresis");
    }
    emit(1, "},");
  }
  if (const Struct* types = section(root, "data_types", "data_types")) {
    if (auto t = string(*types, "grad_accum_dtype", "data_types.grad_accum_dtype")) {
      const std::string own = half ? "fp16" : brain ? "bf16" : "fp32";
      if (*t == "fp32" && own != "fp32")
        emit(1, "grad_accum_dtype = \"fp32\",", "data_types.grad_accum_dtype");
      else if (*t != own)
        issue("data_types.grad_accum_dtype",
              "\"" + *t + "\" is neither fp32 nor the training precision (" + own +
                  "): zerod accumulates in the parameter's type or in fp32");
    }
  }
}

// DeepSpeed 0.19's gradient_allreduce_op: "mean" (its default), the ranks'
// average zerod always takes, or "sum", the update that average times the
// rank count, which zerod does not do. Case as DeepSpeed reads it (lowered).
void Translator::gradient_reduction(const Struct& root) {
  const auto op = string(root, "gradient_allreduce_op", "gradient_allreduce_op");
  if (!op) return;
  const std::string lower = lower_case(*op);
  if (lower == "mean") return;
  if (lower == "sum")
    issue("gradient_allreduce_op",
          "\"sum\" is refused: zerod averages the ranks' gradients (DeepSpeed's \"mean\"); for a sum, scale the "
          "loss by the rank count");
  else
    issue("gradient_allreduce_op", "must be \"mean\" or \"sum\", as DeepSpeed requires, got \"" + *op + "\"");
}

void Translator::zero(const Struct&) {
  const Struct* z = zero_;
  if (!z) return;
  const std::string p = "zero_optimization.";
  // What the stage's partitioner plugin takes (plugins/partitioners/stage).
  std::vector<std::pair<std::string, std::string>> hp;  // zerod name, DeepSpeed key
  hp.push_back({"reduce_bucket_size", "reduce_bucket_size"});
  for (const char* k : {"param_persistence_threshold", "max_live_parameters", "prefetch_bucket_size"}) {
    hp.push_back({k, std::string("stage3_") + k});
    hp.push_back({k, k});  // DeepSpeed's alias without the prefix
  }
  struct Hp {
    std::string name, key;
    double value;
  };
  std::vector<Hp> values;
  for (const auto& [name, key] : hp) {
    auto v = number(*z, key, p + key);
    if (!v) continue;
    const bool takes = name == "reduce_bucket_size" ? stage_ >= 2 : stage_ == 3;
    if (takes) values.push_back({name, key, *v});
    else comments_.push_back(p + key + ": ignored at ZeRO stage " + std::to_string(stage_) + ", as DeepSpeed does");
  }
  emit(1, "zero = {", "zero_optimization");
  emit(2, "stage = " + std::to_string(stage_) + ",", p + "stage");
  for (const Hp& h : values) number_setting(2, h.name, h.value, p + h.key);
  emit(1, "},");

  // Offload: DeepSpeed's devices none/cpu/nvme are zerod's tiers.
  struct Where {
    std::string tier;
    std::string nvme_path;
    std::optional<bool> pin;
  };
  auto read = [&](const char* key) -> std::optional<Where> {
    const Struct* o = section(*z, key, p + key);
    if (!o) return std::nullopt;
    const std::string q = p + key + ".";
    Where w;
    const std::string dev = string(*o, "device", q + "device").value_or("none");
    if (dev == "none") return std::nullopt;
    if (dev != "cpu" && dev != "nvme") {
      issue(q + "device", "must be \"none\", \"cpu\" or \"nvme\", got \"" + dev + "\"");
      return std::nullopt;
    }
    w.tier = dev == "cpu" ? "host" : "nvme";
    w.nvme_path = string(*o, "nvme_path", q + "nvme_path").value_or("");
    w.pin = boolean(*o, "pin_memory", q + "pin_memory");
    return w;
  };
  auto opt = read("offload_optimizer");
  auto par = read("offload_param");
  // The deprecated booleans, which DeepSpeed still turns into the sections.
  if (!opt && boolean(*z, "cpu_offload", p + "cpu_offload").value_or(false)) opt = Where{"host", "", std::nullopt};
  if (!par && boolean(*z, "cpu_offload_param", p + "cpu_offload_param").value_or(false))
    par = Where{"host", "", std::nullopt};
  if (par && stage_ != 3) {
    // DeepSpeed reads offload_param only in its stage-3 optimizer: below,
    // the section is accepted and does nothing (DeepSpeed-Chat writes it at
    // every stage).
    comments_.push_back(p + "offload_param: ignored at ZeRO stage " + std::to_string(stage_) +
                        ", as DeepSpeed ignores it (parameters are offloaded only at stage 3)");
    par.reset();
  }
  if (opt && stage_ == 0) {
    comments_.push_back(p + "offload_optimizer: ignored at ZeRO stage 0: DeepSpeed offloads optimizer state only "
                            "with ZeRO (stages 1-3)");
    opt.reset();
  }
  if (!opt && !par) return;
  emit(1, "offload = {", "zero_optimization");
  if (opt) emit(2, "optimizer = \"" + opt->tier + "\",", p + "offload_optimizer.device");
  if (par) emit(2, "params = \"" + par->tier + "\",", p + "offload_param.device");
  const std::string path = opt && !opt->nvme_path.empty() ? opt->nvme_path : par ? par->nvme_path : "";
  if (opt && par && !opt->nvme_path.empty() && !par->nvme_path.empty() && opt->nvme_path != par->nvme_path)
    issue(p + "offload_param.nvme_path", "differs from offload_optimizer.nvme_path; zerod keeps one set of nvme "
                                         "directories for both (offload.nvme_path)");
  if (!path.empty()) emit(2, "nvme_path = " + lua_string(path) + ",", p + (opt && !opt->nvme_path.empty() ? "offload_optimizer" : "offload_param") + ".nvme_path");
  if (const Struct* o = section(*z, "offload_optimizer", p + "offload_optimizer"); o && opt) {
    if (auto r = number(*o, "ratio", p + "offload_optimizer.ratio")) {
      if (*r < 1 && stage_ != 3)
        issue(p + "offload_optimizer.ratio", "a partial offload (ratio < 1) is only for ZeRO stage 3, as DeepSpeed "
                                             "refuses it below");
      else
        number_setting(2, "ratio", *r, p + "offload_optimizer.ratio", "offload.ratio");
    }
    if (auto b = number(*o, "buffer_count", p + "offload_optimizer.buffer_count"))
      number_setting(2, "buffer_count", *b, p + "offload_optimizer.buffer_count", "offload.buffer_count");
  }
  // DeepSpeed 0.19 pins offloaded memory unless told not to (pin_memory
  // defaults to true), as zerod's host tier does; a false is written out.
  const bool host = (opt && opt->tier == "host") || (par && par->tier == "host");
  if (host) {
    const bool pin = (opt && opt->pin.value_or(true)) || (par && par->pin.value_or(true));
    emit(2, std::string("host = { pin = ") + (pin ? "true" : "false") + " },",
         p + (opt ? "offload_optimizer" : "offload_param") + ".pin_memory");
  }
  emit(1, "},");
}

void Translator::optimizer(const Struct& root) {
  const Struct* o = section(root, "optimizer", "optimizer");
  if (!o) {
    comments_.push_back("no optimizer: zerod's default (adamw, lr 1e-3, weight_decay 0.01); zerod.deepspeed "
                        "fills it in from a torch optimizer given to initialize()");
    return;
  }
  const auto type = string(*o, "type", "optimizer.type");
  if (!type) {
    issue("optimizer.type", "is required");
    return;
  }
  // DeepSpeed matches its own optimizers' names in any case (Adam, AdamW;
  // OneBitAdam until 0.19) and takes any other as torch.optim's, exactly.
  const std::string lower = lower_case(*type);
  auto it = optimizer_plugins().find(lower);
  if (it == optimizer_plugins().end()) {
    issue("optimizer.type", "\"" + *type + "\" has no zerod optimizer plugin (zerod translates Adam, AdamW, "
                            "OneBitAdam and SGD; 0/1 Adam and 1-bit LAMB are zerod plugins to name in a Lua job, "
                            "docs/onebit.md; Lamb, Lion, Adagrad, Muon and torch.optim's others are not built)");
    return;
  }
  if (lower == "sgd" && *type != "SGD") {
    issue("optimizer.type", "\"" + *type + "\": DeepSpeed takes SGD by torch.optim's name, \"SGD\", and refuses "
                            "other spellings");
    return;
  }
  const Struct empty;
  const Struct* params = section(*o, "params", "optimizer.params");
  if (!params) params = &empty;
  const std::string q = "optimizer.params.";
  std::string name = it->second;
  // Whether DeepSpeed builds torch.optim.AdamW for the section (torch_adam;
  // engine.py, get_optimizer_configuration).
  bool torch_adamw = false;
  // adam_w_mode (DeepSpeed's engine, _configure_basic_optimizer): with Adam
  // it picks the weight decay; with AdamW the type decides, AdamW, and the
  // key is redundant (true) or overridden (false); any other optimizer's
  // constructor is handed it and refuses it.
  if (lower == "adam" || lower == "adamw") {
    const auto w = boolean(*params, "adam_w_mode", q + "adam_w_mode");
    if (lower == "adam" && w && !*w) name = "adam";
    if (lower == "adamw" && w && !*w)
      comments_.push_back(q + "adam_w_mode: false is ignored with type " + *type + ", as DeepSpeed ignores it: "
                          "AdamW always decouples weight decay");
    // torch_adam: torch's optimizer in place of DeepSpeed's kernels,
    // torch.optim.AdamW where the update is AdamW, else torch.optim.Adam.
    torch_adamw = boolean(*params, "torch_adam", q + "torch_adam").value_or(false) && name == "adamw";
  } else {
    for (const char* k : {"adam_w_mode", "torch_adam"})
      if (get(*params, k))
        issue(q + k, "applies to Adam and AdamW only (DeepSpeed hands it to " + *type + ", which refuses it)");
  }
  emit(1, "optimizer = {", "optimizer");
  emit(2, "type = \"" + name + "\",", "optimizer.type");
  std::vector<std::string> keys = {"lr"};
  if (name == "sgd") keys.insert(keys.end(), {"momentum", "dampening", "weight_decay"});
  else keys.insert(keys.end(), {"eps", "weight_decay"});
  if (name == "onebit_adam") keys.push_back("freeze_step");
  for (const std::string& k : keys) {
    auto v = number(*params, k, q + k);
    // DeepSpeed's Adam, AdamW and 1-bit Adam default to weight_decay 0;
    // zerod's adamw to 0.01: write DeepSpeed's out. With torch_adam it is
    // torch.optim.AdamW's default, 0.01 (torch.optim.Adam's is 0).
    if (!v && k == "weight_decay" && torch_adamw) {
      emit(2, "weight_decay = 0.01,  -- torch.optim.AdamW's default, which DeepSpeed builds for torch_adam",
           q + "torch_adam");
      continue;
    }
    if (!v && k == "weight_decay" && name != "sgd") v = 0.0;
    // Every optimizer DeepSpeed 0.19 builds for these types defaults to lr
    // 1e-3 (FusedAdam, DeepSpeedCPUAdam, 1-bit Adam, and torch.optim.SGD,
    // which DeepSpeed hands the params as they are); zerod's sgd plugin to
    // 1e-2. Written out for every type, so the job never rests on a plugin's
    // default (zerod/_dsconfig.py's lr_schedule reports the same).
    if (!v && k == "lr") {
      emit(2, "lr = " + format_number(kDeepSpeedDefaultLr) + ",  -- DeepSpeed 0.19's default, its optimizers' and "
                                                              "torch.optim.SGD's");
      continue;
    }
    if (!v) continue;
    if (k == "lr") {
      opt_lr_ = format_number(*v);
      opt_lr_value_ = *v;
    }
    number_setting(2, k, *v, q + k);
  }
  if (name != "sgd") {
    if (const Value* b = get(*params, "betas"); b && !is_auto(b)) {
      if (b->kind_case() != Value::kListValue || b->list_value().values_size() != 2 ||
          b->list_value().values(0).kind_case() != Value::kNumberValue ||
          b->list_value().values(1).kind_case() != Value::kNumberValue) {
        issue(q + "betas", "must be a list of two numbers, got " + json_text(*b));
      } else {
        emit(2, "betas = { " + format_number(b->list_value().values(0).number_value()) + ", " +
                    format_number(b->list_value().values(1).number_value()) + " },", q + "betas");
      }
    } else if (is_auto(b)) {
      autos_.push_back(q + "betas");
    }
    if (auto bc = boolean(*params, "bias_correction", q + "bias_correction")) {
      if (name == "onebit_adam") comments_.push_back(q + "bias_correction: 1-bit Adam never corrects bias (DeepSpeed's neither)");
      else emit(2, std::string("bias_correction = ") + (*bc ? "true" : "false") + ",", q + "bias_correction");
    }
  } else if (auto n = boolean(*params, "nesterov", q + "nesterov"); n && *n) {
    emit(2, "nesterov = true,", q + "nesterov");
  }
  for (const char* k : {"momentum", "dampening", "nesterov"})
    if (name != "sgd" && get(*params, k)) issue(q + k, "is an SGD hyperparameter; this optimizer is " + *type);
  for (const char* k : {"betas", "eps", "bias_correction", "freeze_step"})
    if ((name == "sgd" || (std::string(k) == "freeze_step" && name != "onebit_adam")) && get(*params, k))
      issue(q + k, "is not a hyperparameter of " + *type);
  emit(1, "},");
}

void Translator::scheduler(const Struct& root) {
  const Struct* s = section(root, "scheduler", "scheduler");
  if (!s) return;
  const auto type = string(*s, "type", "scheduler.type");
  if (!type) {
    issue("scheduler.type", "is required");
    return;
  }
  const Struct empty;
  const Struct* params = section(*s, "params", "scheduler.params");
  if (!params) params = &empty;
  const std::string q = "scheduler.params.";
  auto num = [&](const char* k, std::optional<double> def) -> std::optional<double> {
    auto v = number(*params, k, q + k);
    if (!v && !def) issue(q + k, "is required for " + *type);
    return v ? v : def;
  };
  auto text = [](std::optional<double> v) { return format_number(v.value_or(0)); };
  // Step counts DeepSpeed's schedulers refuse unless whole and >= 1.
  auto steps = [&](const char* k, double def) {
    const double v = num(k, def).value_or(def);
    if (v < 1 || v != std::floor(v)) {
      issue(q + k, "must be a whole number >= 1, got " + format_number(v) + " (DeepSpeed refuses it too)");
      return def;
    }
    return v;
  };
  // DeepSpeed's WarmupLR family forces at least 2 warm-up steps, defaults
  // to a log warm-up, and runs the first update at the lr of "step -1".
  auto warmup_type = [&] {
    const std::string t = string(*params, "warmup_type", q + "warmup_type").value_or("log");
    if (t != "log" && t != "linear") issue(q + "warmup_type", "must be \"log\" or \"linear\", got \"" + t + "\"");
    return t;
  };
  // A parameter the type does not read would be silently dropped: refused.
  static const std::map<std::string, std::vector<std::string>> kReads = {
      {"WarmupLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}},
      {"WarmupDecayLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"}},
      {"WarmupCosineLR", {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"}},
      {"OneCycle", {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
                    "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
                    "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"}},
      {"LRRangeTest", {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
                       "lr_range_test_staircase"}},
  };
  std::vector<std::string> auto_keys;
  if (auto reads = kReads.find(*type); reads != kReads.end())
    for (const auto& [k, v] : params->fields()) {
      if (k != "last_batch_iteration" &&
          std::find(reads->second.begin(), reads->second.end(), k) == reads->second.end())
        issue(q + k, "is not a parameter of DeepSpeed's " + *type);
      else if (is_auto(&v))
        auto_keys.push_back(q + k);
    }
  if (!auto_keys.empty()) {
    // The trainer integration (zerod.deepspeed, the Lightning and Accelerate
    // ones) fills these in and translates again; the job alone has no
    // schedule to run.
    std::sort(auto_keys.begin(), auto_keys.end());
    std::string list;
    for (const auto& k : auto_keys) list += (list.empty() ? "" : ", ") + k;
    for (const auto& k : auto_keys) autos_.push_back(k);
    comments_.push_back("scheduler: " + *type + " is built when the trainer fills in " + list +
                        " (\"auto\"); this job alone keeps the optimizer's lr");
    return;
  }
  std::string lua;
  if (*type == "WarmupLR" || *type == "WarmupDecayLR") {
    const auto min_lr = num("warmup_min_lr", 0.0);
    // WarmupLR's maximum defaults to the optimizer's lr; WarmupDecayLR hands
    // WarmupLR its own default, 0.001 (runtime/lr_schedules.py).
    const auto max_lr = num("warmup_max_lr", *type == "WarmupLR" ? opt_lr_value_ : 1e-3);
    const double warm = std::max(2.0, steps("warmup_num_steps", 1000));
    const std::string args = "warmup_steps = " + format_number(warm) + ", max_lr = " + text(max_lr) +
                             ", min_lr = " + text(min_lr) + ", warmup_type = \"" + warmup_type() + "\"";
    const std::string inner = *type == "WarmupLR"
                                  ? "zerod.warmup_linear{ " + args + " }"
                                  : "zerod.warmup_decay{ total_steps = " + text(num("total_num_steps", std::nullopt)) +
                                        ", " + args + " }";
    lua = "zerod.delayed{ first_lr = " + text(min_lr) + ", schedule = " + inner + " }";
  } else if (*type == "WarmupCosineLR") {
    const double warm = std::max(2.0, steps("warmup_num_steps", 1000));
    lua = "zerod.delayed{ first_lr = 0, schedule = zerod.warmup_cosine{ lr = " + opt_lr_ +
          ", total_steps = " + text(num("total_num_steps", std::nullopt)) + ", warmup_steps = " +
          format_number(warm) + ", warmup_min_ratio = " + text(num("warmup_min_ratio", 0.0)) +
          ", cos_min_ratio = " + text(num("cos_min_ratio", 1e-4)) + ", warmup_type = \"" + warmup_type() + "\" } }";
  } else if (*type == "OneCycle") {
    if (!get(*params, "cycle_momentum"))
      issue(q + "cycle_momentum", "is true by default in DeepSpeed: its OneCycle then rewrites the optimizer's betas "
                                  "every step, which zerod does not do; set \"cycle_momentum\": false");
    const auto first = num("cycle_first_step_size", 2000.0);
    // The staircase: cycle_second_stair_count defaults to the first's, as
    // in DeepSpeed; 0 is its continuous ramp. A count is a number of stairs.
    auto stairs = [&](const char* k, double def) {
      const double v = num(k, def).value_or(def);
      if (v < 0 || v != std::floor(v)) {
        issue(q + k, "must be a whole number >= 0 (the stairs of that half of the cycle; 0 = no staircase), got " +
                         format_number(v));
        return def;
      }
      return v;
    };
    const double first_stairs = stairs("cycle_first_stair_count", 0);
    const double second_stairs = stairs("cycle_second_stair_count", first_stairs);
    // zerod.one_cycle's step t is DeepSpeed's t - 1 already (its first
    // update runs at cycle_min_lr): no delay.
    lua = "zerod.one_cycle{ min_lr = " + text(num("cycle_min_lr", std::nullopt)) + ", max_lr = " +
          text(num("cycle_max_lr", std::nullopt)) + ", first_steps = " + text(first) + ", second_steps = " +
          text(num("cycle_second_step_size", first)) + ", decay_rate = " + text(num("decay_lr_rate", 0.0)) +
          ", decay_steps = " + text(num("decay_step_size", 0.0)) +
          (first_stairs > 0 || second_stairs > 0
               ? ", first_stairs = " + format_number(first_stairs) + ", second_stairs = " + format_number(second_stairs)
               : std::string()) +
          " }";
  } else if (*type == "LRRangeTest") {
    // lr(t) = min_lr * (1 + rate * interval), interval = t / size (whole
    // intervals with the staircase): DeepSpeed's value after t steps, and
    // min_lr, what it sets when made, at t = 0: no delay.
    const double size = steps("lr_range_test_step_size", 2000);
    const bool stair = boolean(*params, "lr_range_test_staircase", q + "lr_range_test_staircase").value_or(false);
    const std::string interval = stair ? "math.floor(t / " + format_number(size) + ")" : "t / " + format_number(size);
    lua = "function(t) return " + text(num("lr_range_test_min_lr", 1e-3)) + " * (1 + " +
          text(num("lr_range_test_step_rate", 1.0)) + " * " + interval + ") end";
  } else {
    issue("scheduler.type", "\"" + *type + "\" is not translated (WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                            "OneCycle and LRRangeTest are; torch.optim.lr_scheduler's go to zerod.deepspeed."
                            "initialize(lr_scheduler=...), which traces them; or write the schedule in Lua: "
                            "docs/job-scripts.md#schedules)");
    return;
  }
  emit(1, "lr = " + lua + ",", "scheduler.type");
}

DsTranslation Translator::run(const Struct& root) {
  if (const Value* o = get(root, "optimizer"); o && o->kind_case() == Value::kStructValue)
    if (const Value* t = get(o->struct_value(), "type"); t && t->kind_case() == Value::kStringValue)
      untranslated_optimizer_ = !optimizer_plugins().count(lower_case(t->string_value()));
  check_keys(root, "");
  zero_ = section(root, "zero_optimization", "zero_optimization");
  if (zero_)
    if (auto s = number(*zero_, "stage", "zero_optimization.stage")) stage_ = static_cast<int>(*s);
  batch_sizes(root);
  gradient_reduction(root);
  precision(root);
  zero(root);
  optimizer(root);
  scheduler(root);
  if (!issues_.empty()) {
    std::stable_sort(issues_.begin(), issues_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string msg;
    for (const auto& [line, text] : issues_)
      msg += (msg.empty() ? "" : "\n") + source_ + ":" + std::to_string(line) + ": " + text;
    fail(ZD_ERR_CONFIG, msg);
  }
  DsTranslation t;
  t.json_line.push_back(0);  // Lua lines count from 1
  auto line = [&](const std::string& text, int json_line) {
    t.lua += text + "\n";
    t.json_line.push_back(json_line);
  };
  line("-- A zerod job script, translated from the DeepSpeed config " + source_ + " (zerod translate).", 0);
  for (const auto& a : autos_)
    line("-- " + a + ": \"auto\", left at the default here; the trainer integrations fill it in", line_of(a));
  for (const auto& c : comments_) line("-- " + c, 0);
  line("local zerod = require(\"zerod\")", 0);
  line("return {", 0);
  for (const Out& o : out_) line(o.text + (o.from.empty() ? "" : "  -- " + o.from), o.from.empty() ? 0 : line_of(o.from));
  line("}", 0);
  return t;
}

}  // namespace

bool looks_like_json(std::string_view text) {
  const auto at = text.find_first_not_of(" \t\r\n");
  return at != std::string_view::npos && text[at] == '{';
}

DsTranslation translate_deepspeed(const std::string& json, const std::string& source, const DsOptions& opt) {
  Struct root;
  google::protobuf::util::JsonParseOptions po;
  po.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &root, po);
  if (!status.ok())
    fail(ZD_ERR_CONFIG, source + ": not a valid JSON object: " + std::string(status.message()));
  return Translator(json, source, opt).run(root);
}

std::string deepspeed_keys_markdown() {
  std::string out;
  for (auto kind : {DsKey::kTranslated, DsKey::kIgnored, DsKey::kDefaultOnly, DsKey::kRefusedByDeepSpeed}) {
    out += kind == DsKey::kTranslated    ? "| DeepSpeed key | zerod |\n|---|---|\n"
           : kind == DsKey::kIgnored     ? "\n| accepted and ignored | why |\n|---|---|\n"
           : kind == DsKey::kDefaultOnly ? "\n| accepted only at | otherwise refused, because |\n|---|---|\n"
                                         : "\n| refused, as DeepSpeed 0.19 refuses it | DeepSpeed's reason |\n|---|---|\n";
    for (const DsKey& k : deepspeed_keys()) {
      if (k.kind != kind) continue;
      const std::string key = "`" + std::string(k.key) + "`";
      out += "| " + (kind == DsKey::kDefaultOnly ? key + " = `" + std::string(k.value) + "`" : key) + " | " +
             std::string(k.note) + " |\n";
    }
  }
  return out;
}

}  // namespace zerod::scripting
