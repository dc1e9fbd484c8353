return {
  trace = { path = "t.json", steps = {5, 2}, every = 3 },
  metrics = { listen = "9400" },
}
