-- The settings table's __index fails while it is read: a refusal naming the key.
return setmetatable({}, { __index = function(t, k) error("x") end })
