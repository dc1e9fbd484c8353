-- A model description with a key a tensor does not have (zerod plan: exit 3).
return {
  { name = "embed.weight", module = "embed", shape = { 1000, 64 } },
  { name = "block0.weight", module = "block0", shape = { 64, 64 }, dtype = "f32" },
}
