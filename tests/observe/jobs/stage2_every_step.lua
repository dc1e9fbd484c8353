-- The observing tests' Python rank (observe_rank.py) at ZeRO stage 2, every
-- step traced: zd_step allocates its reduce buffers and frees them before
-- it returns, a spike the trace's memory counter must still show.
return {
  zero = { stage = 2 },
  optimizer = { type = "adamw", lr = 1e-2 },
  trace = { path = "unused.json", steps = {1, 3} },
}
