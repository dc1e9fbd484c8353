-- 1-bit Adam at ZeRO stage 3: accepted (the compressed exchange replaces
-- the gradient reduce-scatter), with its warm-up as a Lua schedule.
return {
  optimizer = { type = "onebit_adam", freeze_step = 10 },
  zero = { stage = 3 },
  compression = { warmup = function(step) return step < 10 end },
}
