-- The Rust trainer (examples/rust) on two ranks with ZeRO stage 3:
--   zerod run --nproc 2 --job examples/rust/job_stage3.lua -- train_mlp_rs
-- The C example's schedule (examples/c/job.lua). Every parameter is split
-- across the ranks and gathered at each forward_begin / backward_begin: with
-- no persistence threshold even the biases are, so the trainer's views
-- always come from a real gather.
local zerod = require("zerod")

local steps = 300

return {
  precision = "fp32",
  optimizer = { type = "adamw", lr = 1e-2, betas = {0.9, 0.999}, weight_decay = 1e-4 },
  gradient_accumulation_steps = 2,
  gradient_clipping = 1.0,
  lr = zerod.cosine{ warmup_steps = 20, total_steps = steps, max_lr = 1e-2, min_lr = 1e-4 },
  zero = { stage = 3, param_persistence_threshold = 0 },
}
