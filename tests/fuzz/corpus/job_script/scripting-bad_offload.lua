-- Offload settings zerod check must refuse, each with its line.
return {
  zero = { stage = 2 },
  offload = {
    optimizer = "nvme",
    params = "host",
    ratio = 1.5,
  },
}
