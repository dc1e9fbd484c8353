-- Four equal layers of 2M parameters: on four ranks at stage 2, rank r's
-- shard is layer r.
local layers = {}
for i = 0, 3 do
  layers[#layers + 1] = { name = "layer" .. i .. ".weight", module = "layer" .. i, shape = { 2048, 1024 } }
end
return layers
