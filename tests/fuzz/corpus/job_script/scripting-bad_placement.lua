-- A placement policy that returns a tier that does not exist.
return {
  zero = { stage = 3 },
  offload = { optimizer = "host" },
  placement = function(t)
    if t.kind == "optimizer" then return "gpu" end
  end,
}
