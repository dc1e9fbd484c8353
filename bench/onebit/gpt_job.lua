-- bench/onebit/gpt_loss.sh's job: the GPT example (examples/python/train_gpt.py)
-- with the optimizer GPT_OPTIMIZER (adam, onebit_adam, zero_one_adam,
-- onebit_lamb) at ZeRO stage GPT_STAGE, for GPT_STEPS steps. Adam is AdamW
-- without bias correction (the compressing optimizers' warm-up rule); the
-- compressing ones warm up for the first 18% of the steps (0/1 Adam: its
-- variance steps), as DeepSpeed recommends 15-25%. GPT_REPLAY=1 sets
-- compression.replay (1-bit Adam, 0/1 Adam, 1-bit LAMB at stages 1-3).
-- GPT_LR sets the peak learning rate (default 2e-3, Adam's; the cosine ends
-- at a tenth of it), GPT_WARM the warm-up's fraction of the steps (default 0.18) and
-- GPT_VAR_SCALER 0/1 Adam's var_update_scaler (default 16, DeepSpeed's),
-- GPT_LOCAL_SCALER and GPT_LOCAL_CLIPPER its local_step_scaler and
-- local_step_clipper (defaults 80 and 2; clipper 1 syncs every step).
local zerod = require("zerod")

local steps = tonumber(os.getenv("GPT_STEPS") or "800")
local stage = tonumber(os.getenv("GPT_STAGE") or "0")
local which = os.getenv("GPT_OPTIMIZER") or "adam"
local warm = math.floor(tonumber(os.getenv("GPT_WARM") or "0.18") * steps)
local lr = tonumber(os.getenv("GPT_LR") or "2e-3")
local replay = os.getenv("GPT_REPLAY") == "1"

local common = { lr = lr, betas = {0.9, 0.95}, weight_decay = 0.01 }
local optimizers = {
  adam = { type = "adamw", bias_correction = false },
  onebit_adam = { type = "onebit_adam", freeze_step = warm },
  -- Local steps (stage 0 only): the sync interval doubles every 80 updates
  -- after the variance freezes, up to 2. Why 2: on this GPT at 800 steps an
  -- interval up to 2 ends within 1.1% of Adam's loss at lr 2e-3 and 4e-3,
  -- up to 4 at +1.3% / +2.2%, up to 8 at +2.3% / +2.7% (docs/onebit.md),
  -- while the whole run's bytes barely move (the warm-up's dominate).
  zero_one_adam = { type = "zero_one_adam", var_freeze_step = warm, local_steps = (stage == 0),
                    local_step_scaler = tonumber(os.getenv("GPT_LOCAL_SCALER") or "80"),
                    local_step_clipper = tonumber(os.getenv("GPT_LOCAL_CLIPPER") or "2"),
                    var_update_scaler = tonumber(os.getenv("GPT_VAR_SCALER") or "16") },
  onebit_lamb = { type = "onebit_lamb", freeze_step = warm },
}
local opt = assert(optimizers[which], "GPT_OPTIMIZER: adam, onebit_adam, zero_one_adam or onebit_lamb")
for k, v in pairs(common) do opt[k] = v end

return {
  precision = "fp32",
  optimizer = opt,
  gradient_clipping = 1.0,
  zero = { stage = stage },
  compression = replay and { replay = true } or nil,
  lr = zerod.cosine{ warmup_steps = 40, total_steps = steps, max_lr = lr, min_lr = lr / 10 },
}
