-- 1-bit Adam with ZeRO stage 2: refused, with the reason and the line.
return {
  optimizer = { type = "onebit_adam", freeze_step = 10 },
  zero = { stage = 2 },
}
