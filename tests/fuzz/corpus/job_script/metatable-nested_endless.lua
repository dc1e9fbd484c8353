-- A nested settings table whose __index never returns: the instruction budget stops it.
return {
  precision = "fp16",
  fp16 = setmetatable({}, { __index = function(t, k) while true do end end }),
}
