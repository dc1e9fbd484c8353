-- The observing tests' Python rank (observe_rank.py) at ZeRO stage 3 with
-- the optimizer in host memory; the test adds --metrics and --trace.
return {
  zero = { stage = 3, param_persistence_threshold = 0 },
  optimizer = { type = "adamw", lr = 1e-2 },
  offload = { optimizer = "host" },
  budgets = { host = "64MiB" },
  trace = { path = "unused.json", steps = {2, 5} },
}
