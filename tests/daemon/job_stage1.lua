-- End-to-end daemon tests: ZeRO stage 1, a short collective timeout.
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = 1 },
  comm = { timeout = 1.0 },
}
