-- job_keep.lua with comm.timeout = 0 (wait forever): a restarted rank waits
-- for the others to re-attach however late they come.
return {
  optimizer = { type = "adamw", lr = 0.05 },
  zero = { stage = 2 },
  comm = { timeout = 0 },
  daemon = { keep_state = true },
}
