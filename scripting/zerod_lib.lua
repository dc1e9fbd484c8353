-- The `zerod` library that job scripts see: size literals and the usual
-- learning-rate schedules. A schedule is a function of the step (the number
-- of optimizer updates already applied, 0 for the first) that returns the
-- learning rate; assign one to the job's `lr` field.
--
-- Errors blame the line of the script that called the library: level 2
-- from a schedule constructor, level 3 from check() inside one.
local zerod = ...  -- the table the host made, holding size() and the units

local function fail(msg) error(msg, 4) end  -- from check(): past check and the constructor

-- What each schedule function is, for `zerod check` ("zerod.cosine{...}").
local described = setmetatable({}, {__mode = "k"})
function zerod.describe(f) return described[f] end

local function remember(fname, args, f)
  local keys = {}
  for k in pairs(args) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. " = " .. tostring(args[k]) end
  described[f] = ("zerod.%s{ %s }"):format(fname, table.concat(parts, ", "))
  return f
end

-- Checks a schedule's argument table against a spec {name = {kind, default}}
-- where kind is "number", "count" (integer >= 0) or a table of choices; a
-- default of false makes the argument optional.
local function check(fname, args, spec)
  if type(args) ~= "table" then
    error(("zerod.%s expects a table of arguments, e.g. zerod.%s{ ... }"):format(fname, fname), 3)
  end
  for k in pairs(args) do
    if spec[k] == nil then
      local known = {}
      for name in pairs(spec) do known[#known + 1] = name end
      table.sort(known)
      fail(("zerod.%s: unknown argument '%s' (known: %s)"):format(fname, tostring(k), table.concat(known, ", ")))
    end
  end
  local out = {}
  for name, s in pairs(spec) do
    local kind, default = s[1], s[2]
    local v = args[name]
    if v == nil then
      if default == nil then fail(("zerod.%s: argument '%s' is required"):format(fname, name)) end
      v = default
    end
    if v == false then
      -- optional and absent
    elseif type(kind) == "table" then
      local ok = false
      for _, c in ipairs(kind) do ok = ok or v == c end
      if not ok then
        fail(("zerod.%s: %s must be one of %s, got %s"):format(fname, name, table.concat(kind, ", "), tostring(v)))
      end
    elseif type(v) ~= "number" then
      fail(("zerod.%s: %s must be a number, got %s"):format(fname, name, type(v)))
    elseif v ~= v or v == math.huge or v == -math.huge then
      -- Taken, inf or nan fails later, mid-run, as an lr of nan.
      fail(("zerod.%s: %s must be a finite number, got %s"):format(fname, name, tostring(v)))
    elseif kind == "count" and (v < 0 or math.floor(v) ~= v) then
      fail(("zerod.%s: %s must be a whole number >= 0, got %s"):format(fname, name, tostring(v)))
    elseif kind == "number" and v < 0 then
      fail(("zerod.%s: %s must be >= 0, got %s"):format(fname, name, tostring(v)))
    end
    if v ~= false then out[name] = v end
  end
  return out
end

local warmup_types = {"linear", "log"}

-- The warm-up fraction at step t of w warm-up steps (DeepSpeed's WarmupLR).
-- (The log form multiplies by 1 / ln(w) as DeepSpeed does, to the last bit.)
local function warmup_gamma(t, w, kind)
  if t >= w then return 1.0 end
  if kind == "log" then
    if w < 2 then return 1.0 end
    return (1.0 / math.log(w)) * math.log(t + 1)
  end
  return t / w
end

-- Constant learning rate.
function zerod.constant(args)
  local a = check("constant", args, {lr = {"number"}})
  return remember("constant", a, function(_) return a.lr end)
end

-- min_lr rising to max_lr over warmup_steps, then max_lr.
function zerod.warmup_linear(args)
  local a = check("warmup_linear", args, {warmup_steps = {"count"}, max_lr = {"number"},
    min_lr = {"number", 0.0}, warmup_type = {warmup_types, "linear"}})
  return remember("warmup_linear", a, function(t)
    return a.min_lr + (a.max_lr - a.min_lr) * warmup_gamma(t, a.warmup_steps, a.warmup_type)
  end)
end

-- Warm-up, then a straight line down to min_lr at total_steps.
function zerod.warmup_decay(args)
  local a = check("warmup_decay", args, {warmup_steps = {"count"}, total_steps = {"count"},
    max_lr = {"number"}, min_lr = {"number", 0.0}, warmup_type = {warmup_types, "linear"}})
  -- total_steps <= warmup_steps is allowed, as DeepSpeed's WarmupDecayLR
  -- allows it (with a warning): after the warm-up the lr is min_lr.
  return remember("warmup_decay", a, function(t)
    if t < a.warmup_steps then
      return a.min_lr + (a.max_lr - a.min_lr) * warmup_gamma(t, a.warmup_steps, a.warmup_type)
    end
    local left = math.max(0, a.total_steps - t) / math.max(1, a.total_steps - a.warmup_steps)
    return a.min_lr + (a.max_lr - a.min_lr) * left
  end)
end

-- Warm-up, then half a cosine from max_lr down to min_lr at total_steps.
function zerod.cosine(args)
  local a = check("cosine", args, {warmup_steps = {"count", 0}, total_steps = {"count"},
    max_lr = {"number"}, min_lr = {"number", 0.0}, warmup_type = {warmup_types, "linear"}})
  if a.total_steps <= a.warmup_steps then
    error("zerod.cosine: total_steps must be greater than warmup_steps", 2)
  end
  return remember("cosine", a, function(t)
    if t < a.warmup_steps then
      return a.min_lr + (a.max_lr - a.min_lr) * warmup_gamma(t, a.warmup_steps, a.warmup_type)
    end
    local span = a.total_steps - a.warmup_steps
    local s = math.min(t - a.warmup_steps, span)
    return a.min_lr + (a.max_lr - a.min_lr) * (1 + math.cos(math.pi * s / span)) / 2
  end)
end

-- One cycle (DeepSpeed's OneCycle): min_lr up to max_lr over first_steps,
-- back down over second_steps, then min_lr decayed by decay_rate every
-- decay_steps. With first_stairs (second_stairs) > 0 the lr of that half
-- climbs (falls) in that many equal stairs instead of every step; 0 is the
-- continuous ramp, and second_stairs defaults to first_stairs, as in
-- DeepSpeed. Each value is computed as DeepSpeed 0.19's _get_scale_factor
-- and _get_decay_lr compute it (runtime/lr_schedules.py), operation for
-- operation: a stair is picked by floor(), where a last bit differs a whole
-- stair would.
function zerod.one_cycle(args)
  local a = check("one_cycle", args, {min_lr = {"number"}, max_lr = {"number"},
    first_steps = {"count"}, second_steps = {"count", false}, decay_rate = {"number", 0.0},
    decay_steps = {"count", 0}, first_stairs = {"count", 0}, second_stairs = {"count", false}})
  local second = a.second_steps or a.first_steps
  if a.first_steps < 1 or second < 1 then
    error("zerod.one_cycle: first_steps and second_steps must be at least 1", 2)
  end
  local second_stairs = a.second_stairs or a.first_stairs
  local total = a.first_steps + second
  local ratio = a.first_steps / total
  return remember("one_cycle", a, function(t)
    if t <= total then
      local x = 1 + t / total - math.floor(1 + t / total)  -- back to 0 (min_lr) when the cycle ends
      local f, stairs
      if x <= ratio then
        f, stairs = x / ratio, a.first_stairs
      else
        f, stairs = (x - 1) / (ratio - 1), second_stairs
      end
      if stairs > 0 then
        -- From the step count, not from f: f at the top of an uneven cycle
        -- can land a bit under 1 and floor() would drop a stair.
        local c = t % total
        local at = c <= a.first_steps and c * stairs / a.first_steps or (total - c) * stairs / second
        f = math.floor(at) / stairs
      end
      return a.min_lr + (a.max_lr - a.min_lr) * f
    end
    if a.decay_rate == 0 or a.decay_steps == 0 then return a.min_lr end
    local k = t - total
    return a.min_lr / (1 + a.decay_rate * (k / a.decay_steps))
  end)
end

-- DeepSpeed's WarmupCosineLR: lr times a ratio that warms up from
-- warmup_min_ratio to 1 over warmup_steps (at least 2), then follows half a
-- cosine down to cos_min_ratio at total_steps; t is DeepSpeed's iteration.
function zerod.warmup_cosine(args)
  local a = check("warmup_cosine", args, {lr = {"number"}, total_steps = {"count"}, warmup_steps = {"count"},
    warmup_min_ratio = {"number", 0.0}, cos_min_ratio = {"number", 1e-4}, warmup_type = {warmup_types, "log"}})
  local w = math.max(2, a.warmup_steps)
  local inv = 1.0 / math.log(w)
  return remember("warmup_cosine", a, function(t)
    local ratio
    if t < w then
      local r = a.warmup_type == "log" and inv * math.log(t + 1) or t / w
      ratio = a.warmup_min_ratio + r * (1.0 - a.warmup_min_ratio)
    else
      local progress = math.min(1.0, (t - w + 1) / math.max(1, a.total_steps - w))
      ratio = math.max(0.0, a.cos_min_ratio + (1.0 - a.cos_min_ratio) * ((1 + math.cos(math.pi * progress)) / 2))
    end
    return a.lr * ratio
  end)
end

-- DeepSpeed's schedulers run the first update at the lr they set when they
-- were made and update t at their value for t - 1: zerod.delayed{ first_lr
-- = x, schedule = f } is f shifted so (the DeepSpeed translation uses it).
function zerod.delayed(args)
  if type(args) ~= "table" then
    error("zerod.delayed expects a table of arguments, e.g. zerod.delayed{ first_lr = 0, schedule = f }", 2)
  end
  for k in pairs(args) do
    if k ~= "first_lr" and k ~= "schedule" then
      error(("zerod.delayed: unknown argument '%s' (known: first_lr, schedule)"):format(tostring(k)), 2)
    end
  end
  local f, first = args.schedule, args.first_lr
  if type(f) ~= "function" then error("zerod.delayed: schedule must be a function, e.g. a zerod schedule", 2) end
  if type(first) ~= "number" or first ~= first or first == math.huge or first == -math.huge then
    error("zerod.delayed: first_lr must be a finite number", 2)
  end
  local g = function(t)
    if t == 0 then return first end
    return f(t - 1)
  end
  described[g] = ("zerod.delayed{ first_lr = %s, schedule = %s }"):format(tostring(first), described[f] or "a function")
  return g
end

-- A schedule given as its values: lr(t) = values[t + 1], the last one after
-- the table ends (the trainer integrations write a torch scheduler so).
function zerod.table(args)
  if type(args) ~= "table" or type(args.values) ~= "table" or #args.values == 0 then
    error("zerod.table expects { values = { lr0, lr1, ... } }", 2)
  end
  local v, n = args.values, #args.values
  for i = 1, n do
    if type(v[i]) ~= "number" then error(("zerod.table: values[%d] must be a number"):format(i), 2) end
    -- Here, at the caller's line: found at lr(i - 1) it was blamed on this file.
    if v[i] ~= v[i] or v[i] < 0 or v[i] == math.huge then
      error(("zerod.table: values[%d] is %s; a learning rate is a finite number >= 0"):format(i, tostring(v[i])), 2)
    end
  end
  local g = function(t) return v[math.min(t + 1, n)] end
  described[g] = ("zerod.table{ %d values, %s ... %s }"):format(n, tostring(v[1]), tostring(v[n]))
  return g
end

return zerod
