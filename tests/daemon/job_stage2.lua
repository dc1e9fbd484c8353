-- End-to-end daemon tests: ZeRO stage 2, a short collective timeout.
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = 2 },
  comm = { timeout = 1.0 },
}
