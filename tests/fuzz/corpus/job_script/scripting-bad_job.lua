-- A job script with mistakes, for `zerod check` tests.
local zerod = require("zerod")

return {
  precision = "bf16",
  gradient_clipp1ng = 1.0,
  optimizer = {
    type = "adamw", betas = {0.9, 1.5},
  },
}
