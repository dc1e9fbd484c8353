-- Stage 2 on four ranks where the placement puts one layer's master copy
-- and Adam's moments in host memory: only the rank whose shard holds that
-- layer (rank 1 of plan_model_four_layers.lua) needs host memory, more than
-- the budget. `zerod plan` once looked at ranks 0 and 3 only and said it fit.
return {
  zero = { stage = 2 },
  budgets = { host = "8MiB" },
  placement = function(t)
    if t.module == "layer1" and t.kind ~= "params" then return "host" end
  end,
}
