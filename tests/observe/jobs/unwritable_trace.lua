-- A trace path no process can write (/dev/null is not a folder): the model
-- is refused when it is created, before any step, with the reason.
return {
  zero = { stage = 0 },
  optimizer = { type = "adamw", lr = 1e-3 },
  trace = { path = "/dev/null/trace.json", steps = {2, 4} },
}
