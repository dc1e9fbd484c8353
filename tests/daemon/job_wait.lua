-- Call-ring tests: ZeRO stage 3 (a begin is a collective), a collective
-- timeout long enough that only a death ends a wait.
return {
  optimizer = { type = "sgd" },
  zero = { stage = 3, param_persistence_threshold = 0 },
  comm = { timeout = 60.0 },
}
