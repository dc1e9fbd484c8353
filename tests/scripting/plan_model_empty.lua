-- A model description that lists no tensors (zerod plan: exit 3).
return {}
