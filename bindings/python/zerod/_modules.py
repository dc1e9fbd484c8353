"""Which torch modules become which zerod modules (the units of residency).

- modules=None: every module that owns trainable parameters directly (for
  most models the leaf layers), for those parameters alone.
- modules=[classes and/or fnmatch patterns of qualified names]: each match is
  one unit for its whole subtree (a match inside a match is part of it);
  parameters outside every match fall back to the rule above.
- A module with no forward of its own (nn.ParameterList, nn.ParameterDict,
  nn.ModuleList: containers) never runs, so its hooks would never make its
  parameters resident: its parameters go to the nearest ancestor that has a
  forward (the module whose forward reads them), and a modules= match
  without a forward is not taken (its children may still match).
- Parameters with no elements (nn.Linear(0, n), an empty LoRA rank) stay in
  torch: there is nothing to partition or update, and zerod's registry
  takes positive extents only.
- Units that share a Parameter (weight tying) are merged into one zerod
  module named by joining theirs, so every parameter has exactly one home.
"""
import fnmatch
from collections import OrderedDict

from torch import nn

from .errors import InvalidArgumentError


def plan_modules(model, modules):
    """[(zerod module name, [its torch modules], [(param name, Parameter)])],
    in the model's order. `modules` as zerod.torch.initialize takes it."""
    named = list(model.named_modules())
    chosen, inside = {}, set()  # id(module) -> its subtree's parameters; ids under a chosen one
    if modules is not None:
        specs = list(modules) if isinstance(modules, (list, tuple, set)) else [modules]
        used = [False] * len(specs)
        runless = [None] * len(specs)  # the first match of each spec that has no forward
        for name, m in named:  # parents come before their children
            if id(m) in inside:
                continue
            for i, spec in enumerate(specs):
                hit = isinstance(m, spec) if isinstance(spec, type) else fnmatch.fnmatchcase(name, spec)
                if hit and not _runs(m):
                    runless[i] = runless[i] or name
                elif hit:
                    used[i] = True
                    chosen[id(m)] = _held(m.parameters())
                    inside.update(id(c) for c in m.modules())
                    break
        _refuse_unused(model, named, specs, used, runless)
    units = _units(named, chosen, inside)
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


def _runs(module):
    """Whether calling the module runs code of its own: containers
    (ModuleList, ParameterList, ...) keep nn.Module's forward, which no
    model calls, so hooks on them never fire."""
    return type(module).forward is not nn.Module.forward or "forward" in vars(module)


def _held(params):
    """The parameters zerod holds, of `params`: trainable, with elements."""
    return [p for p in params if p.requires_grad and p.numel()]


def _refuse_unused(model, named, specs, used, runless):
    missing = [s for s, u in zip(specs, used) if not u]
    if not missing:
        return
    examples = ", ".join(f"'{n}'" for n, _ in named[1:6])
    containers = [f"'{n}'" for s, u, n in zip(specs, used, runless) if not u and n is not None]
    why = (f" (only {', '.join(containers)}, which has no forward of its own, so it never runs: name its "
           "children or the module whose forward uses it)" if containers else "")
    raise InvalidArgumentError(
        f"modules={missing!r} matched no submodule of {type(model).__name__}{why}; give classes or "
        f"patterns of qualified names such as {examples}")


def _units(named, chosen, inside):
    """[(name, module, parameters)] in the model's module order: the chosen
    modules with their subtrees' parameters, and every other module that
    runs with its own parameters and those of the modules without a
    forward below it (a ParameterList's go to the module that uses it)."""
    by_name = dict(named)
    own = OrderedDict()  # id(host module) -> [its name, it, parameters]
    for name, m in named:
        if id(m) in chosen:
            own[id(m)] = [name, m, chosen[id(m)]]
            continue
        if id(m) in inside:
            continue
        params = _held(m.parameters(recurse=False))
        if not params:
            continue
        host_name, host = _nearest_running(name, m, by_name)
        own.setdefault(id(host), [host_name, host, []])[2].extend(params)
    # In the model's module order (a host may come before the module that
    # gave it its first parameters, or be added after it).
    order = {id(m): i for i, (_, m) in enumerate(named)}
    return sorted((tuple(u) for u in own.values() if u[2]), key=lambda u: order[id(u[1])])


def _nearest_running(name, module, by_name):
    """(name, module) of `module` itself where it runs, else of its nearest
    ancestor that does; itself where none does (a container as the model:
    nothing calls it)."""
    at = name
    while not _runs(by_name[at]):
        if not at:
            return name, module
        at = at.rpartition(".")[0]
    return at, by_name[at]
