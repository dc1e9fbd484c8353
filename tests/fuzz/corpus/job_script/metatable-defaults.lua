-- Defaults through an __index table: ordinary Lua, it loads.
local defaults = { gradient_accumulation_steps = 2, optimizer = { type = "adamw", lr = 1e-3 } }
return setmetatable({ zero = { stage = 2 } }, { __index = defaults })
