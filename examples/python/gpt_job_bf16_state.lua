-- The main job (gpt_job.lua) with AdamW's m and v kept in bf16
-- (optimizer.state_dtype): 2 bytes per element each instead of 4, updated in
-- fp32 and rounded back; the fp32 master stays. docs/offload.md compares the
-- two jobs' losses and host bytes:
--   zerod run --nproc 2 --job examples/python/gpt_job_bf16_state.lua -- \
--     /usr/bin/python3 examples/python/train_gpt.py
local zerod = require("zerod")

local steps = 800

return {
  precision = "fp32",
  optimizer = { type = "adamw", lr = 2e-3, betas = {0.9, 0.99}, weight_decay = 0.01, state_dtype = "bf16" },
  gradient_clipping = 1.0,
  zero = { stage = 3, param_persistence_threshold = 0 },
  offload = { optimizer = "host" },
  lr = zerod.cosine{ warmup_steps = 40, total_steps = steps, max_lr = 2e-3, min_lr = 2e-4 },
}
