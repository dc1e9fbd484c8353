-- The C example (examples/c/train_mlp.c) at ZeRO stage 3 with parameter
-- shards and optimizer state on NVMe, two micro-batches per step, recording
-- steps 2-4: every kind of event a trace holds (gathers and prefetch,
-- gradient buckets, the optimizer on NVMe, NVMe reads and writes, waits on
-- the other rank).
local nvme = os.getenv("ZEROD_NVME_PATH") or "/var/tmp/zerod-nvme"
return {
  zero = { stage = 3, param_persistence_threshold = 0, reduce_bucket_size = 2048 },
  optimizer = { type = "adamw", lr = 1e-2 },
  gradient_accumulation_steps = 2,
  offload = { params = "nvme", optimizer = "nvme", nvme_path = nvme, tile_size = "64KiB" },
  trace = { path = "trace.json", steps = {2, 4} },
}
