-- sgd keeps its momentum in fp32 only: a bf16 state is refused, naming it.
return {
  optimizer = {
    type = "sgd",
    momentum = 0.9,
    state_dtype = "bf16",
  },
}
