-- End-to-end daemon tests: ZeRO stage 3, a short collective timeout.
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = 3, param_persistence_threshold = 0, reduce_bucket_size = 1500 },
  comm = { timeout = 1.0 },
}
