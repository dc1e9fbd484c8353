-- plan_job.lua with Adam's moments kept in bf16 (optimizer.state_dtype).
return {
  zero = { stage = 2 },
  offload = { optimizer = "host" },
  budgets = { host = "1GiB" },
  optimizer = { type = "adamw", state_dtype = "bf16" },
}
