-- The state is kept in fp32 or bf16, nothing else.
return {
  optimizer = { type = "adamw", state_dtype = "fp16" },
}
