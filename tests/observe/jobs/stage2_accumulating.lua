-- The observing tests' Python rank (observe_rank.py) at ZeRO stage 2 with
-- two micro-batches a step: its steps allocate buffers in the device tier
-- (host RAM on the cpu device) beyond the planned state.
return {
  zero = { stage = 2 },
  optimizer = { type = "adamw", lr = 1e-2 },
  gradient_accumulation_steps = 2,
}
