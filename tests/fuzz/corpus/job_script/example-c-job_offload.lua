-- The C example with ZeRO-Infinity placement: run it on 2 ranks through the
-- daemon (see docs/offload.md). Parameters are sharded (stage 3) and their
-- shards live in host RAM; the fp32 master copy and Adam's moments live on
-- disk under ZEROD_NVME_PATH and stream through the read -> update -> write
-- pipeline at every step.
--
--   mkdir -p /var/tmp/zerod-nvme
--   zerod run --nproc 2 --job examples/c/job_offload.lua -- build/bin/train_mlp
local zerod = require("zerod")

local steps = 300
local nvme = os.getenv("ZEROD_NVME_PATH") or "/var/tmp/zerod-nvme"

return {
  precision = "fp32",
  zero = { stage = 3, param_persistence_threshold = 0 },
  optimizer = { type = "adamw", lr = 1e-2, betas = {0.9, 0.999}, weight_decay = 1e-4 },
  gradient_accumulation_steps = 2,
  gradient_clipping = 1.0,
  lr = zerod.cosine{ warmup_steps = 20, total_steps = steps, max_lr = 1e-2, min_lr = 1e-4 },
  offload = { params = "host", optimizer = "nvme", nvme_path = nvme, tile_size = "64KiB" },
  budgets = { host = "64MiB", nvme = "1GiB" },
  -- Biases are tiny: keep their optimizer state in RAM, send the rest to disk.
  placement = function(t)
    if t.kind ~= "params" and t.numel < 1024 then return "host" end
  end,
}
