-- The reference for gpt_onebit_job.lua: the same job with Adam in place of
-- 1-bit Adam — AdamW without bias correction, which is the update 1-bit Adam
-- runs before its freeze step (and DeepSpeed's OnebitAdam all along).
local zerod = require("zerod")

local steps = tonumber(os.getenv("GPT_STEPS") or "800")

return {
  precision = "fp32",
  optimizer = { type = "adamw", lr = 2e-3, betas = {0.9, 0.95}, weight_decay = 0.01, bias_correction = false },
  gradient_clipping = 1.0,
  zero = { stage = 1 },
  lr = zerod.cosine{ warmup_steps = 40, total_steps = steps, max_lr = 2e-3, min_lr = 2e-4 },
}
