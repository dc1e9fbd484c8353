"""Which torch modules become which zerod modules (the units of residency).

- modules=None: every module that owns trainable parameters directly (for
  most models the leaf layers), for those parameters alone.
- modules=[classes and/or fnmatch patterns of qualified names]: each match is
  one unit for its whole subtree (a match inside a match is part of it);
  parameters outside every match fall back to the rule above.
- Units that share a Parameter (weight tying) are merged into one zerod
  module named by joining theirs, so every parameter has exactly one home.
"""
import fnmatch
from collections import OrderedDict

from .errors import InvalidArgumentError


def plan_modules(model, modules):
    """[(zerod module name, [its torch modules], [(param name, Parameter)])],
    in the model's order. `modules` as zerod.torch.initialize takes it."""
    named = list(model.named_modules())
    chosen, inside = {}, set()  # id(module) -> its subtree's parameters; ids under a chosen one
    if modules is not None:
        specs = list(modules) if isinstance(modules, (list, tuple, set)) else [modules]
        used = [False] * len(specs)
        for name, m in named:  # parents come before their children
            if id(m) in inside:
                continue
            for i, spec in enumerate(specs):
                hit = isinstance(m, spec) if isinstance(spec, type) else fnmatch.fnmatchcase(name, spec)
                if hit:
                    used[i] = True
                    chosen[id(m)] = [p for p in m.parameters() if p.requires_grad]
                    inside.update(id(c) for c in m.modules())
                    break
        missing = [s for s, u in zip(specs, used) if not u]
        if missing:
            examples = ", ".join(f"'{n}'" for n, _ in named[1:6])
            raise InvalidArgumentError(
                f"modules={missing!r} matched no submodule of {type(model).__name__}; give classes or "
                f"patterns of qualified names such as {examples}")
    units = []  # (name, module, parameters), in the model's module order
    for name, m in named:
        if id(m) in chosen:
            params = chosen[id(m)]
        elif id(m) not in inside:
            params = [p for p in m.parameters(recurse=False) if p.requires_grad]
        else:
            continue
        if params:
            units.append((name, m, params))

    # Units that share a parameter become one zerod module (union-find).
    parent = list(range(len(units)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner = {}
    for i, (_, _, params) in enumerate(units):
        for p in params:
            j = owner.setdefault(id(p), i)
            if j != i:
                parent[root(i)] = root(j)
    members = OrderedDict()
    for i in range(len(units)):
        members.setdefault(root(i), []).append(i)
    group_of = {id(p): root(i) for i, (_, _, params) in enumerate(units) for p in params}
    params_of = OrderedDict((r, []) for r in members)
    for pname, p in model.named_parameters():  # each Parameter once, in the model's order
        r = group_of.get(id(p))
        if r is not None:
            params_of[r].append((pname, p))
    plan = []
    for r, idx in members.items():
        name = "+".join(units[i][0] or "<root>" for i in idx)
        plan.append((name, [units[i][1] for i in idx], params_of[r]))
    return plan
