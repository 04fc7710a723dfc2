"""The package's layout holds: imports point down the layers, never in a circle, and the preloads stay thin.

Layers, top to bottom: the driver (rose/*.py) > graph, ops, envs > runtime, models > config, errors.
A module imports its own layer or below. The built-in environments register themselves when their
package is imported (`rose.envs.base` imports `rose.envs.guess`, which imports `rose.envs.base`):
the one circle allowed.
"""
import ast
import os

import rose

ROOT = os.path.dirname(rose.__file__)


def _modules() -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = "rose." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _layer(mod: str) -> int:
    part = mod.split(".")[1] if "." in mod else ""
    if part in ("config", "errors"):
        return 4
    if part in ("runtime", "models"):
        return 3
    if part in ("graph", "ops", "envs"):
        return 2
    return 1


def _imports(mods: dict[str, str]) -> dict[str, set[str]]:
    edges = {}
    for mod, path in mods.items():
        found = set()
        for n in ast.walk(ast.parse(open(path).read())):
            if isinstance(n, ast.Import):
                found |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                found |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
        edges[mod] = {t for t in found if t in mods and t != mod and t != "rose"}
    return edges


def test_no_module_imports_upward():
    mods = _modules()
    upward = [f"{m} -> {t}" for m, ts in _imports(mods).items() if m != "rose"
              for t in ts if _layer(t) < _layer(m) and not t.startswith(m + ".")]
    assert upward == []


def test_no_import_cycles():
    mods = _modules()
    edges = _imports(mods)
    # A package's __init__ re-exporting its modules is not a dependency of theirs on it.
    edges = {m: {t for t in ts if not mods[t].endswith("__init__.py")} for m, ts in edges.items()}
    cycles, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for t in sorted(edges[m]):
            if state.get(t) == "open":
                cycle = path[path.index(t):] + [t]
                if not all(".envs" in x for x in cycle):
                    cycles.append(" -> ".join(cycle))
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_preloads_are_thin():
    for name in ("plugin.py", "worker.py"):
        with open(os.path.join(ROOT, name)) as f:
            assert sum(1 for _ in f) < 100, name
