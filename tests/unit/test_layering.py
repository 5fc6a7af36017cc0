"""The library's layering (DESIGN section 2), checked on the source: no import cycles between
modules or between packages, imports only point down, the math is torch-only, ``envs`` never imports
the library and the library never imports ``envs`` or ``callbacks``.

The graph is static: every ``import`` statement in a module counts, including lazy ones inside
functions (a lazy import still couples the two modules), except those under ``if TYPE_CHECKING:``;
so do imports by string (:func:`string_imports`: ``importlib.import_module("...")``,
``__import__("...")`` and strings naming ``envs`` or ``callbacks``, such as
``gymnasium.make("envs:ragen/Sokoban-v0")``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ragen_lightning
from tests.unit.test_sizes import body_lines

LIB = Path(ragen_lightning.__file__).parent
ROOT = LIB.parent
FORBIDDEN = (
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "vllm",
    "transformers",
    "torchmetrics",
    "peft",
)
# Each package's layer: imports may only go to the same or a lower layer (and never around a cycle).
LAYERS = {
    "types": 0,
    "errors": 0,
    "registry": 0,  # registry: stdlib only, so algos may register into it
    "algos": 1,
    "parallel": 2,
    "metrics": 2,
    "rollout": 2,
    # the tiny model's tokenizer is trained on rollout's prompt text; rollout never imports models
    "models": 3,
    "data": 4,
    "sft": 4,
    "starpo": 5,
    "cli": 6,
    "evaluate": 6,
}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Top-level packages of the repository that the library must not reach, not even by name. A string
# naming one of them or a module in it counts as an import: "envs.grid.sokoban.env", a class path
# "callbacks.collapse.CollapseMonitor", gymnasium's "envs:ragen/Sokoban-v0" and the bare "envs" (the
# `MODULE = "envs"` constant passed on to importlib or gymnasium, a default `["envs"]` of module
# names), except where a string is a key or an attribute name rather than a module: a dict display's
# key, a subscript, the key of .get/.pop/.setdefault, the name of getattr/hasattr/setattr/ delattr,
# the left side of `in` (`{"envs": [...]}` is a keyword argument's name).
NAMED_PACKAGES = ("envs", "callbacks")
# The bare word "callbacks" is also Lightning's trainer group (`--trainer.callbacks`, a config key
# the CLI reads), so bare it counts only where it reaches import machinery: an import call's
# argument or a constant bound to a name.
BARE_NAME_IS_ALSO_A_KEY = ("callbacks",)
# importlib.import_module, from importlib import import_module
_IMPORT_CALLS = ("import_module", "__import__")
_KEY_CALLS = ("get", "pop", "setdefault")  # the first argument is a key
# the second argument is an attribute name
_NAME_CALLS = ("getattr", "hasattr", "setattr", "delattr")


def _callee(call: ast.Call) -> str:
    func = call.func
    return (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else ""
    )


def _resolve(module: str, package: str) -> str:
    """A relative module name (``.x``, ``..x``) resolved against ``package`` as ``importlib`` does;
    absolute names, and relative ones without a known package, unchanged."""
    if not module.startswith(".") or not package:
        return module
    level = len(module) - len(module.lstrip("."))
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([module[level:]] if module[level:] else []))


def _named_module(text: str) -> str | None:
    """The module a string names when it is one of :data:`NAMED_PACKAGES` or a module in it,
    optionally followed by ``:<anything>`` (gymnasium's ``module:id``, an entry point's
    ``module:attr``); else None."""
    module = text.split(":", 1)[0]
    parts = module.split(".")
    if parts[0] in NAMED_PACKAGES and all(p.isidentifier() for p in parts):
        return module
    return None


def string_imports(tree: ast.AST, name: str = "", package: str = "") -> set[str]:
    """Modules that ``tree`` imports by string: the literal first argument of
    ``importlib.import_module`` / ``__import__`` (a relative one resolved against the package
    argument: a literal, ``__name__`` = ``name`` or ``__package__`` = ``package``), and every string
    naming a module of :data:`NAMED_PACKAGES` (rules above)."""
    keys: set[int] = set()
    bound: set[int] = set()  # string constants an import call receives or a name is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            keys.add(id(node.left))
        elif isinstance(node, ast.Call) and _callee(node) in _KEY_CALLS and node.args:
            keys.add(id(node.args[0]))
        elif isinstance(node, ast.Call) and _callee(node) in _NAME_CALLS and len(node.args) > 1:
            keys.add(id(node.args[1]))
        elif isinstance(node, ast.Call) and _callee(node) in _IMPORT_CALLS and node.args:
            bound.add(id(node.args[0]))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            bound.add(id(node.value))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node) in _IMPORT_CALLS and node.args:
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue  # computed: not statically known
            where = (
                node.args[1]
                if len(node.args) > 1
                else next((k.value for k in node.keywords if k.arg in ("package", "globals")), None)
            )
            base = (
                where.value
                if isinstance(where, ast.Constant) and isinstance(where.value, str)
                else name
                if isinstance(where, ast.Name) and where.id == "__name__"
                else package
            )
            found.add(_resolve(first.value, base))
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in keys
        ):
            module = _named_module(node.value)
            if module and (module not in BARE_NAME_IS_ALSO_A_KEY or id(node) in bound):
                found.add(module)
    return found


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of the ``ragen_lightning`` package that ``path`` imports (``from pkg import sub``
    counts as ``pkg.sub`` when ``sub`` is a module), by statement or by string
    (:func:`string_imports`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    type_checking = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ragen_lightning")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "ragen_lightning":
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
    found.update(
        m for m in string_imports(tree, name, package) if m.split(".")[0] == "ragen_lightning"
    )
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p, ROOT): p for p in sorted(LIB.rglob("*.py"))}
    return {name: _imports(path, name, set(paths)) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_find_cycle_detects_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    # relative: from .losses import
    assert "ragen_lightning.algos.losses" in graph["ragen_lightning.algos.advantages"]
    # lazy, in a function
    assert "ragen_lightning.rollout.vllm_engine" in graph["ragen_lightning.rollout.engines"]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with every module collapsed to its package below the root
    (``ragen_lightning.rollout.runner`` -> ``ragen_lightning.rollout``; a root module stays itself);
    edges inside one package are dropped."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(package(module), set()).update(package(t) for t in targets)
    return {name: targets - {name} for name, targets in out.items()}


def _strings(source: str, name: str = "pkg.mod", package: str = "pkg") -> set[str]:
    return string_imports(ast.parse(source), name, package)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('import importlib\nimportlib.import_module("envs")', {"envs"}),
        (
            'from importlib import import_module\nimport_module("callbacks.collapse")',
            {"callbacks.collapse"},
        ),
        ('__import__("envs.grid.sokoban.env")', {"envs.grid.sokoban.env"}),
        (
            'importlib.import_module("ragen_lightning.rollout.runner")',
            {"ragen_lightning.rollout.runner"},
        ),
        # __name__ of a package
        ('importlib.import_module(".functional", __name__)', {"pkg.mod.functional"}),
        ('importlib.import_module(".functional", __package__)', {"pkg.functional"}),
        ('importlib.import_module("..x", package="a.b.c")', {"a.b.x"}),
        ('CORPUS_MODULE = "envs"', {"envs"}),  # a constant passed on later
        ('MODULE: str = "callbacks"', {"callbacks"}),
        ('def f(a):\n    return a.modules or ["envs"]', {"envs"}),  # a default list of module names
        ('gym.make("envs:ragen/Sokoban-v0")', {"envs"}),
        ('gym.make(f"envs:{env_id}")', {"envs"}),
        (
            'gym.register(id="x/Y-v0", entry_point="envs.text.bandit:BanditEnv")',
            {"envs.text.bandit"},
        ),
        (
            'cfg = {"class_path": "callbacks.collapse.CollapseMonitor"}',
            {"callbacks.collapse.CollapseMonitor"},
        ),
        ('importlib.import_module("callbacks")', {"callbacks"}),
    ],
)
def test_string_imports_catch_every_form(source, expected):
    assert _strings(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        'extra = {"envs": [1, 2]}',  # a keyword argument's name
        'kw["envs"]',
        'config.get("envs")',
        'getattr(trainer, "callbacks", [])',
        '"callbacks" in trainer',
        # Lightning's trainer.callbacks config group
        'for group in ("logger", "callbacks"):\n    trainer.get(group)',
        'x = "environments"',
        'x = "envs_count"',
        'x = "my envs"',
        'x = "envs. They"',
        'x = "callbacks are optional"',
        # prose naming them
        '"""Import ``envs`` first: ``gymnasium.make("envs:ragen/Sokoban-v0")``."""',
        # computed: not static
        "importlib.import_module(name)",
        'importlib.import_module(f"{__name__}.{sub}")',
        'importlib.util.find_spec("vllm")',
    ],
)
def test_string_imports_leave_unrelated_strings_alone(source):
    assert _strings(source) == set()


def test_graph_sees_string_imports(tmp_path):
    pkg = tmp_path / "ragen_lightning" / "metrics"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        'import importlib\nimportlib.import_module(".functional", __name__)\n'
    )
    known = {"ragen_lightning.metrics", "ragen_lightning.metrics.functional"}
    assert _imports(pkg / "__init__.py", "ragen_lightning.metrics", known) == {
        "ragen_lightning.metrics.functional"
    }
    (pkg / "mod.py").write_text('def f():\n    return gym.make("envs:ragen/Bandit-v0")\n')
    assert _roots(pkg / "mod.py") == {"envs"}


def test_no_import_cycle_among_library_modules():
    assert find_cycle(import_graph()) is None


def test_package_graph_collapses_modules():
    graph = {"r.a.x": {"r.a.y", "r.b.z"}, "r.a.y": set(), "r.b.z": {"r.c"}, "r.c": set()}
    assert package_graph(graph) == {"r.a": {"r.b"}, "r.b": {"r.c"}, "r.c": set()}
    assert find_cycle(package_graph({"r.a.x": {"r.b.y"}, "r.b.z": {"r.a.w"}})) == [
        "r.a",
        "r.b",
        "r.a",
    ]


def test_no_import_cycle_among_library_packages():
    """Packages form a DAG too: two packages that import each other (even through different modules,
    which the module-level test accepts) are one concept split in two, or a piece living in the
    wrong one."""
    assert find_cycle(package_graph(import_graph())) is None


def test_every_package_has_a_layer():
    names = {
        _module_name(p, ROOT).split(".")[1]
        for p in LIB.rglob("*.py")
        if p.parent != LIB or p.stem != "__init__"
    }
    assert names <= set(LAYERS), (
        f"give these packages a layer in LAYERS: {sorted(names - set(LAYERS))}"
    )


def test_imports_point_down_or_sideways_only():
    upward = [
        (a, b)
        for a, targets in import_graph().items()
        for b in targets
        if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)
    ]
    assert upward == []


def test_at_most_four_modules_at_the_package_root():
    """One concept, one home (DESIGN section 2): the root holds the leaves every layer shares
    (types, errors) and entry points; everything else lives in a package."""
    root = sorted(p.name for p in LIB.glob("*.py") if p.name != "__init__.py")
    assert len(root) <= 4, root


def test_types_and_errors_are_leaves():
    graph = import_graph()
    assert graph["ragen_lightning.types"] == set()
    assert graph["ragen_lightning.errors"] == set()


def _roots(path: Path) -> set[str]:
    """Top-level packages ``path`` imports, by statement or by string (relative imports are its own
    package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = {m.split(".")[0] for m in string_imports(tree) if not m.startswith(".")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add((node.module or "").split(".")[0])
    return out


def test_errors_and_types_need_no_third_party_package_but_torch():
    """tests/conftest.py imports ``errors`` (the harmless-warnings list) before anything else:
    standard library only."""
    assert {r for r in _roots(LIB / "errors.py") if r not in sys.stdlib_module_names} == set()
    assert {r for r in _roots(LIB / "types.py") if r not in sys.stdlib_module_names} <= {"torch"}


@pytest.mark.parametrize("folder", ["ragen_lightning/algos"])
def test_math_imports_only_torch_stdlib_and_itself(folder):
    files = sorted((ROOT / folder).glob("*.py")) + [LIB / "metrics" / "functional.py"]
    for path in files:
        for root in _roots(path):
            assert root in ("torch", "ragen_lightning") or root in sys.stdlib_module_names, (
                f"{path.name}: {root}"
            )
    graph = import_graph()
    assert all(
        m.startswith("ragen_lightning.algos") for m in graph["ragen_lightning.metrics.functional"]
    )


@pytest.mark.parametrize("module", ["ragen_lightning.algos", "ragen_lightning.metrics.functional"])
def test_math_import_does_not_load_lightning_or_vllm(module):
    # A fresh interpreter: other tests in this process may already have imported lightning.
    code = (
        f"import json, sys; import {module}; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_envs_never_import_the_library_or_callbacks():
    for path in sorted((ROOT / "envs").rglob("*.py")):
        assert not _roots(path) & {"ragen_lightning", "callbacks"}, path


def test_library_never_imports_callbacks_or_envs():
    for path in sorted(LIB.rglob("*.py")):
        assert not _roots(path) & {"callbacks", "envs"}, path


def test_module_sizes_stay_readable():
    """DESIGN section 5: the StarPO module reads top to bottom (at most 450 lines as ``ruff format``
    writes them, which was 350 hand-wrapped; ``training_step``'s body at most 60 lines and still the
    numbered steps); module and function sizes everywhere: tests/unit/test_sizes.py."""
    module = LIB / "starpo" / "module.py"
    assert len(module.read_text().splitlines()) <= 450
    step = next(
        n
        for n in ast.walk(ast.parse(module.read_text()))
        if isinstance(n, ast.FunctionDef) and n.name == "training_step"
    )
    assert body_lines(step) <= 60
    numbered = [
        line.strip()[:4]
        for line in ast.get_source_segment(module.read_text(), step).splitlines()
        if line.strip()[:2] in ("# ",)
    ]
    assert [n for n in numbered if n[2:3].isdigit()] == ["# 1.", "# 2.", "# 3.", "# 4.", "# 5."]
