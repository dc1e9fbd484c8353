-- A job with no offload table: zerod check still lists every offload.*
-- setting with its default, as it lists the budgets (docs/offload.md).
return { zero = { stage = 3 } }
