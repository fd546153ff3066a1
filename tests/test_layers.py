# Ref: issue 19 (a layered tree: imports run one way, no cycles); docs/architecture.md.
"""The tree's layers, checked from the source: every import (module level or inside a function)
of every project module, read with :mod:`ast`, must run down the layers, and no modules may
import each other in a cycle.

Packages, bottom up (a package may import the ones below it, never one above)::

    hw       gateware: hw.headers and hw.iface at the base, then hw.lib, hw.net, hw.rdma,
             hw.kbtp, hw.target (each may import only those before it)
    roce     the Python RoCEv2 RC endpoint and CM                     -> hw
    host     codec, configuration, driver, CM server, initiator, tools -> hw, roce
    model    the golden model                                         -> hw, roce, host
    boards   the ECP5 board layer                                     -> hw
    sim      simulation harnesses and tools                           -> everything above
    tools    operator tools (Wireshark dissector generator)           -> everything above

Nothing outside tests/ imports tests/.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: package -> the packages it may import (besides itself).
ALLOWED = {
    "hw": set(),
    "roce": {"hw"},
    "host": {"hw", "roce"},
    "model": {"hw", "roce", "host"},
    "boards": {"hw"},
    "sim": {"hw", "roce", "host", "model", "boards"},
    "tools": {"hw", "roce", "host", "model", "boards", "sim"},
}
#: The layers inside hw, bottom up.
HW_LAYERS = [("hw.headers", "hw.iface"), ("hw.lib",), ("hw.net",), ("hw.rdma",), ("hw.kbtp",),
             ("hw.target",)]


def _module_of(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules():
    """{module name: path} of every Python module of the project packages."""
    out = {}
    for pkg in ALLOWED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_of(path)] = path
    return out


def imports_of(name, path, known):
    """Project modules that ``name`` imports (absolute and relative, at any depth of the file)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            # the longest known module that t names (a name imported from a module counts as
            # an import of that module)
            parts = t.split(".")
            for k in range(len(parts), 0, -1):
                cand = ".".join(parts[:k])
                if cand in known:
                    if cand != name:
                        out.add(cand)
                    break
    return out


def _hw_layer(mod):
    for k, names in enumerate(HW_LAYERS):
        if any(mod == n or mod.startswith(n + ".") for n in names):
            return k
    return None


def violations(graph):
    bad = []
    for a, deps in sorted(graph.items()):
        pa = a.split(".")[0]
        for b in sorted(deps):
            pb = b.split(".")[0]
            if pa != pb and pb not in ALLOWED[pa]:
                bad.append(f"{a} -> {b} ({pb} is above {pa})")
            elif pa == pb == "hw":
                la, lb = _hw_layer(a), _hw_layer(b)
                if la is not None and lb is not None and lb > la:
                    bad.append(f"{a} -> {b} (hw layer {lb} is above {la})")
    return bad


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph():
    mods = project_modules()
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def test_every_import_runs_down_the_layers(graph):
    assert violations(graph) == []


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_nothing_imports_tests():
    for pkg in ALLOWED:
        for path in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n == "tests" or n.startswith("tests.") for n in names), path


def test_the_checks_catch_what_they_promise():
    """A backwards import, a layer inversion inside hw, and a cycle are each reported."""
    g = {"hw.lib.stream": {"host.codec"}, "host.codec": set(), "hw.net.ip": {"hw.rdma.qp"},
         "hw.rdma.qp": set(), "sim.a": {"sim.b"}, "sim.b": {"sim.a"}}
    bad = violations(g)
    assert any("hw.lib.stream -> host.codec" in x for x in bad)
    assert any("hw.net.ip -> hw.rdma.qp" in x for x in bad)
    assert cycles(g) == [["sim.a", "sim.b"]]
    # and the reader sees function-level and relative imports
    mods = project_modules()
    assert "hw.headers" in imports_of("host.codec", mods["host.codec"], mods)
    assert "boards" in imports_of("boards.build", mods["boards.build"], mods)
