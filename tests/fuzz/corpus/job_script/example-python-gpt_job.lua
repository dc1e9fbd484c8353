-- The job script of the main job (examples/python/train_gpt.py): a
-- character-level GPT on 2 ranks, ZeRO stage 3 with the optimizer in the
-- host tier, AdamW with a warm-up and a cosine decay over the trainer's 800
-- steps.
local zerod = require("zerod")

local steps = 800

return {
  precision = "fp32",
  optimizer = { type = "adamw", lr = 2e-3, betas = {0.9, 0.99}, weight_decay = 0.01 },
  gradient_clipping = 1.0,
  -- Every parameter is partitioned: the default threshold (1e5 elements)
  -- would keep all of this small model's tensors whole on every rank.
  zero = { stage = 3, param_persistence_threshold = 0 },
  -- Optimizer state and fp32 master in the host tier, updated there by the
  -- CPU optimizer (docs/offload.md).
  offload = { optimizer = "host" },
  lr = zerod.cosine{ warmup_steps = 40, total_steps = steps, max_lr = 2e-3, min_lr = 2e-4 },
}
