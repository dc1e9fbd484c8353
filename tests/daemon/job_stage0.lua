-- End-to-end daemon tests: ZeRO stage 0, a short collective timeout.
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = 0 },
  comm = { timeout = 1.0 },
}
