-- The global zerod replaced: lr is kept, described by where it is defined.
zerod = 5
return { lr = function(s) return 1e-3 end }
