-- ZeRO-Offload: stage 2 with the master copy and Adam's moments in host RAM.
return { zero = { stage = 2 }, offload = { optimizer = "host" }, budgets = { host = "1GiB" } }
