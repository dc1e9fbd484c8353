-- The GPT example (examples/python/train_gpt.py) with 1-bit Adam
-- (docs/onebit.md) on ZeRO stage 1: plain Adam for the first 18% of the
-- steps, then each rank's momentum is averaged with 1-bit compression and
-- the second moment stays frozen. With compression.replay every rank
-- replays the owners' updates from that momentum and a whole copy of the
-- frozen second moment, so the fp32 working copies are not all-gathered
-- after a compressed step (bit for bit the same parameters).
--
--   PYTHONPATH=bindings/python build/bin/zerod run --nproc 2 \
--     --job examples/python/gpt_onebit_job.lua -- python3 examples/python/train_gpt.py
--
-- GPT_STEPS tells the schedule how many steps the trainer runs (train_gpt.py
-- --steps; 800 by default).
local zerod = require("zerod")

local steps = tonumber(os.getenv("GPT_STEPS") or "800")

return {
  precision = "fp32",
  optimizer = { type = "onebit_adam", lr = 2e-3, betas = {0.9, 0.95}, weight_decay = 0.01,
                freeze_step = math.floor(0.18 * steps) },
  gradient_clipping = 1.0,
  zero = { stage = 1 },
  compression = { replay = true },
  lr = zerod.cosine{ warmup_steps = 40, total_steps = steps, max_lr = 2e-3, min_lr = 2e-4 },
}
