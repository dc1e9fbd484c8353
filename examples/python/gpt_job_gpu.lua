-- The job script of the main job on a GPU (scripts/run-main.sh gpu): the
-- GPT of train_gpt.py, larger, in bf16 on the GPU (fp32 master and AdamW),
-- ZeRO stage 3 with everything in the GPU's memory, one rank per GPU under
-- the zerod daemon, which owns that memory (docs/devices.md). The
-- optimizer and schedule are gpt_job.lua's.
local zerod = require("zerod")

local steps = 800

return {
  device = "cuda",
  precision = "bf16",
  optimizer = { type = "adamw", lr = 2e-3, betas = {0.9, 0.99}, weight_decay = 0.01 },
  gradient_clipping = 1.0,
  zero = { stage = 3 },
  lr = zerod.cosine{ warmup_steps = 40, total_steps = steps, max_lr = 2e-3, min_lr = 2e-4 },
}
