-- A job that keeps its state in the daemon when its ranks die, for a restart.
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = 2 },
  comm = { timeout = 5 },
  daemon = { keep_state = true },
}
