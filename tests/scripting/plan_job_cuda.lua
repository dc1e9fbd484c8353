-- plan_job.lua on a GPU: `zerod plan` plans it on a machine without one too.
return { device = "cuda", zero = { stage = 2 }, offload = { optimizer = "host" }, budgets = { host = "1GiB" } }
