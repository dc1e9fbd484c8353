-- A model description for `zerod plan --model`: one row per tensor.
return {
  { name = "embed.weight", module = "embed", shape = { 50304, 768 } },
  { name = "block0.attn.weight", module = "block0", shape = { 768, 2304 } },
  { name = "block0.mlp.weight", module = "block0", shape = { 768, 3072 } },
  { name = "block0.ln.bias", module = "block0", shape = { 768 } },
}
