-- examples/c/job.lua in bf16 (bf16 working copies, fp32 master): the job
-- of the C-versus-Rust output comparison in bf16.
local zerod = require("zerod")

local steps = 300

return {
  precision = "bf16",
  optimizer = { type = "adamw", lr = 1e-2, betas = {0.9, 0.999}, weight_decay = 1e-4 },
  gradient_accumulation_steps = 2,
  gradient_clipping = 1.0,
  lr = zerod.cosine{ warmup_steps = 20, total_steps = steps, max_lr = 1e-2, min_lr = 1e-4 },
}
