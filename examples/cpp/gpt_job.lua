-- The job script of the C++ GPT (examples/cpp/train_gpt.cpp): AdamW with a
-- warm-up and a cosine decay over the trainer's 600 steps, clipping, ZeRO
-- stage 3 with the optimizer state and fp32 master in the host tier.
-- Run it on 2 ranks (one GPU serves both, or the CPU):
--
--   zerod run --nproc 2 --job examples/cpp/gpt_job.lua -- build/bin/train_gpt
--
-- or embedded, one rank (`build/bin/train_gpt` reads this file by default).
local zerod = require("zerod")

local steps = 600

return {
  precision = "fp32",  -- the trainer computes in fp32
  optimizer = { type = "adamw", lr = 1e-2, betas = {0.9, 0.99}, weight_decay = 0.01 },
  gradient_clipping = 1.0,
  -- Every parameter is partitioned: the default threshold (1e5 elements)
  -- would keep all of this small model's tensors whole on every rank.
  zero = { stage = 3, param_persistence_threshold = 0 },
  offload = { optimizer = "host" },
  -- Of max_lr 2e-3, 5e-3, 1e-2 and 2e-2 (each with min_lr a tenth of it),
  -- 1e-2 ended lowest: final losses 1.15, 0.95, 0.90, 0.91 (embedded,
  -- stage 0, 600 steps); a model this small takes more than the main
  -- job's 2e-3.
  lr = zerod.cosine{ warmup_steps = 30, total_steps = steps, max_lr = 1e-2, min_lr = 1e-3 },
}
