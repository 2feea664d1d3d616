"""The module map of ../shared/STYLE.md and the README's "How it works", checked on the source: every import
(top level and inside functions; ``if TYPE_CHECKING:`` blocks left out, they never run, except where a test counts
them) read with ``ast``."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rollout_diag"
DRIVERS = (
    "rollout_diag.drivers.engine",
    "rollout_diag.drivers.compare",
    "rollout_diag.drivers.distributed",
    "rollout_diag.drivers.passes",
)
HEAVY = ("torch", "rich", "plotly", "pyarrow", "polars", "typer", "ray")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, types: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """The imports in ``tree``, at any depth; those under ``if TYPE_CHECKING:`` only with ``types``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _type_checking_only(node) and not types:
            pending.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


@cache
def imports_of(name: str, types: bool = False) -> frozenset[str]:
    """Modules ``name`` imports: package modules by full name, anything else by its top-level name.
    ``from pkg import sub`` counts as an import of ``pkg.sub`` when that is a module. With ``types``, the imports
    for type checking too (an arrow to a reader of the code, if not to the interpreter)."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8")), types):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in modules() else base)
    return frozenset(t if t.startswith("rollout_diag") else t.split(".")[0] for t in targets)


def reachable(name: str, avoid: tuple[str, ...] = ()) -> set[str]:
    """Every module ``name`` imports, directly or through package modules (but not through those in ``avoid``)."""
    seen: set[str] = set()
    pending = [name]
    while pending:
        for target in imports_of(pending.pop()):
            if target not in seen and not in_group(target, avoid):
                seen.add(target)
                if target in modules():
                    pending.append(target)
    return seen


def in_group(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == prefix or target.startswith(prefix + ".") for prefix in prefixes)


def test_the_walk_sees_the_package():
    assert {
        "rollout_diag.drivers.engine",
        "rollout_diag.drivers.passes",
        "rollout_diag.report",
        "rollout_diag.io.reader",
    } <= set(modules())
    assert "rollout_diag.drivers.passes" in imports_of("rollout_diag.drivers.distributed")
    assert "torch" in imports_of("rollout_diag.drivers.passes")


@pytest.mark.parametrize("types", [False, True], ids=["run", "run-and-types"])
def test_no_import_circle(types):
    """No circle among the modules, neither in what runs nor counting the imports for type checking (a circle of
    either kind ties the modules into one piece that cannot be read, tested or moved apart)."""
    graph = {name: {t for t in imports_of(name, types) if t in modules() and t != name} for name in modules()}
    # A package's __init__ runs before its submodules; an arrow from a submodule to its own package is no circle.
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circle = [*path[path.index(target) :], target]
                pytest.fail("import circle: " + " → ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_distributed_and_engine_share_the_pass_module():
    assert "rollout_diag.drivers.engine" not in reachable("rollout_diag.drivers.distributed")
    assert "rollout_diag.drivers.engine" not in reachable("rollout_diag.drivers.passes")
    assert "rollout_diag.drivers.distributed" not in reachable("rollout_diag.drivers.passes")


@pytest.mark.parametrize("group", ["rollout_diag.report", "rollout_diag.render"])
def test_presentation_imports_no_driver_io_metrics_or_torch(group):
    forbidden = (*DRIVERS, "rollout_diag.drivers.exports", "rollout_diag.io", "rollout_diag.metrics", "torch")
    for name in [n for n in modules() if in_group(n, (group,))]:
        wrong = sorted(t for t in reachable(name) if in_group(t, forbidden))
        assert not wrong, f"{name} reaches {wrong}"


def test_report_and_render_are_independent():
    for name in [n for n in modules() if in_group(n, ("rollout_diag.report",))]:
        assert not [t for t in reachable(name) if in_group(t, ("rollout_diag.render",))], name
    for name in [n for n in modules() if in_group(n, ("rollout_diag.render",))]:
        assert not [t for t in reachable(name) if in_group(t, ("rollout_diag.report",))], name


@pytest.mark.parametrize(
    "name",
    [
        "rollout_diag.results",
        "rollout_diag.catalogue",
        "rollout_diag.formatting",
        "rollout_diag.decisions.intrusive",
        "rollout_diag.decisions.dialects",
        "rollout_diag.decisions.sweep",
        "rollout_diag.errors",
    ],
)
def test_contract_and_neutral_modules_import_nothing_heavy(name):
    heavy = sorted(t for t in reachable(name) if t in HEAVY)
    assert not heavy, f"{name} reaches {heavy}"


def test_io_imports_no_metrics_presets_or_presentation():
    forbidden = ("rollout_diag.metrics", "rollout_diag.presets", "rich", "typer")
    for name in [n for n in modules() if in_group(n, ("rollout_diag.io",))]:
        wrong = sorted(t for t in imports_of(name) if in_group(t, forbidden))
        assert not wrong, f"{name} imports {wrong}"


def test_metrics_import_no_presentation_or_cli():
    forbidden = ("rollout_diag.render", "rollout_diag.report", "rollout_diag.cli", "rich", "typer", "ray")
    for name in [n for n in modules() if in_group(n, ("rollout_diag.metrics",))]:
        wrong = sorted(t for t in imports_of(name) if in_group(t, forbidden))
        assert not wrong, f"{name} imports {wrong}"


# The command line's shared pieces; every other module of rollout_diag/cli/ is a command (or a family of them).
CLI_SHARED = {"app", "boundary", "coercion", "layout", "options", "output"}


def test_the_cli_is_the_top_and_its_commands_stand_alone():
    """Nothing in the package imports the command line (it is the top layer, a program over the library); inside it,
    a command's module imports the shared pieces and the library, never another command's module (each command a
    few lines over the library, its options from the one shared declaration)."""
    cli = [name for name in modules() if in_group(name, ("rollout_diag.cli",))]
    assert "rollout_diag.cli.analyze" in cli and "rollout_diag.cli.options" in cli
    outside = sorted(
        (name, target)
        for name in modules()
        if not in_group(name, ("rollout_diag.cli",))
        for target in imports_of(name)
        if in_group(target, ("rollout_diag.cli",))
    )
    assert outside == []
    commands = {name for name in cli if name.rpartition(".")[2] not in {*CLI_SHARED, "cli", "__main__"}}
    assert {"rollout_diag.cli.analyze", "rollout_diag.cli.watch"} <= commands
    crossing = sorted((name, target) for name in commands for target in imports_of(name) if target in commands)
    assert crossing == []
    shared = sorted(
        (name, target)
        for name in cli
        if name.rpartition(".")[2] in CLI_SHARED
        for target in imports_of(name)
        if target in commands
    )
    assert shared == [], "a shared piece of the command line names no command"


def test_engine_imports_no_io_metrics_decisions_or_presentation():
    """engine/ says how a chunk's numbers are computed fast; what is measured lives in metrics/, above it, and the
    chunks it reads come from io/, above it too (``engine.stats.ChunkArrays``)."""
    forbidden = (
        "rollout_diag.io",
        "rollout_diag.metrics",
        "rollout_diag.decisions",
        "rollout_diag.groups",
        "rich",
        "typer",
    )
    for name in [n for n in modules() if in_group(n, ("rollout_diag.engine",))]:
        wrong = sorted(t for t in imports_of(name) if in_group(t, forbidden))
        assert not wrong, f"{name} imports {wrong}"


def _private_names_imported(name: str, source: str) -> list[str]:
    """The ``_private`` names a module takes from another module of ``source`` (a package prefix)."""
    found = []
    for node in _import_nodes(ast.parse(modules()[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and in_group(node.module, (source,)):
            found += [f"{node.module}.{alias.name}" for alias in node.names if alias.name.startswith("_")]
    return found


def test_metrics_import_no_private_name_of_the_engine():
    for name in [n for n in modules() if in_group(n, ("rollout_diag.metrics", "rollout_diag.groups"))]:
        assert not _private_names_imported(name, "rollout_diag.engine"), name


def test_a_private_import_from_the_engine_is_caught(tmp_path, monkeypatch):
    module = tmp_path / "probe.py"
    module.write_text("from rollout_diag.engine.stats import _reduce\n", encoding="utf-8")
    monkeypatch.setitem(modules(), "probe", module)
    assert _private_names_imported("probe", "rollout_diag.engine") == ["rollout_diag.engine.stats._reduce"]


def test_only_the_engine_and_io_import_the_kernels():
    """The compiled passes are the engine's (and the reader's scans): drivers, metrics and the CLI ask the engine."""
    allowed = ("rollout_diag.engine.kernels", "rollout_diag.engine", "rollout_diag.io")
    for name in [n for n in modules() if not in_group(n, allowed) and n != "rollout_diag"]:
        wrong = sorted(t for t in imports_of(name) if in_group(t, ("rollout_diag.engine.kernels",)))
        assert not wrong, f"{name} imports {wrong}"


WATCH_MODULES = ("watch", "watcher", "watchfiles", "watchreport")


def test_watch_finds_its_accumulators_without_reflection():
    for name in WATCH_MODULES:
        source = modules()[f"rollout_diag.drivers.{name}"].read_text(encoding="utf-8")
        assert "vars(" not in source and "__module__" not in source, name


def test_watch_modules_point_one_way():
    """watch (the loop) → watcher (the run state) → watchfiles (per-file records) and watchreport (what is said)."""
    order = [f"rollout_diag.drivers.{name}" for name in WATCH_MODULES]
    for index, name in enumerate(order):
        assert not set(imports_of(name)) & set(order[: index + 1]) - {name}, name
    assert "rollout_diag.drivers.watchreport" not in imports_of("rollout_diag.drivers.watchfiles")


def test_compare_holds_only_the_comparison():
    tree = ast.parse(modules()["rollout_diag.drivers.compare"].read_text(encoding="utf-8"))
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert classes == [], "result types live in results/, writers in io/ and exports.py"


def test_the_intrusive_thresholds_live_in_one_module():
    """Numeric ``INTRUSIVE_*`` constants in the catalogue (results/ names them as defaults without importing a
    judgement), the rule itself in decisions.intrusive (render's INTRUSIVE_STYLE is a colour, not a limit)."""
    owners: dict[str, set[str]] = {"threshold": set(), "rule": set()}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                threshold = isinstance(node.value, ast.Constant) and isinstance(node.value.value, (int, float))
                if threshold and any(isinstance(t, ast.Name) and t.id.startswith("INTRUSIVE_") for t in targets):
                    owners["threshold"].add(name)
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == "intrusive_reasons":
                owners["rule"].add(name)
    assert owners == {"threshold": {"rollout_diag.catalogue"}, "rule": {"rollout_diag.decisions.intrusive"}}


# The README's module map ("How it works"): group -> what nothing in it may reach.
MODULE_MAP = {
    "rollout_diag.drivers.dump": ("rollout_diag.drivers.engine", "rollout_diag.drivers.compare", "rich", "typer"),
    "rollout_diag.drivers.passes": (
        "rollout_diag.drivers.engine",
        "rollout_diag.drivers.compare",
        "rollout_diag.drivers.distributed",
    ),
    "rollout_diag.drivers.engine": ("rich", "typer", "plotly", "rollout_diag.render", "rollout_diag.report"),
    "rollout_diag.drivers.compare": ("rich", "typer", "plotly", "rollout_diag.render", "rollout_diag.report"),
    "rollout_diag.drivers.distributed": (
        "rollout_diag.drivers.engine",
        "rollout_diag.drivers.compare",
        "rich",
        "typer",
        "plotly",
    ),
    "rollout_diag.drivers.exports": (
        "rich",
        "typer",
        "plotly",
        "rollout_diag.drivers.engine",
        "rollout_diag.drivers.compare",
    ),
    "rollout_diag.results": ("torch", "rich", "plotly", "rollout_diag.render", "rollout_diag.report"),
    "rollout_diag.catalogue": ("torch", "rich", "plotly", "rollout_diag.metrics", "rollout_diag.io"),
    "rollout_diag.decisions": ("rich", "plotly", "rollout_diag.render", "rollout_diag.report"),
    "rollout_diag.formatting": ("rich", "torch", "plotly"),
    "rollout_diag.render": ("torch", "rollout_diag.report"),
    "rollout_diag.report": ("typer", "torch", "rollout_diag.render"),
    "rollout_diag.export": (
        "torch",
        "rollout_diag.drivers",
        "rollout_diag.metrics",
        "rollout_diag.decisions",
        "rollout_diag.render",
        "rollout_diag.report",
    ),
}


@pytest.mark.parametrize("group", sorted(MODULE_MAP))
def test_the_readme_module_map_holds(group):
    for name in [n for n in modules() if in_group(n, (group,))]:
        wrong = sorted(t for t in reachable(name) if in_group(t, MODULE_MAP[group]))
        assert not wrong, f"{name} reaches {wrong}"


# Judgement lives in decisions/ and runs once, when a result is built; renderers only read the result's findings.
# decisions.sweep and decisions.dialects are allowed: they turn numbers into sentences and judge nothing.
JUDGING = ("rollout_diag.decisions",)
DESCRIBING = ("rollout_diag.decisions.sweep", "rollout_diag.decisions.dialects")
RENDERERS = ("rollout_diag.render", "rollout_diag.report")


def judging_imports(targets: frozenset[str] | set[str]) -> list[str]:
    """The judging modules among ``targets`` (modules a renderer imports)."""
    return sorted(t for t in targets if in_group(t, JUDGING) and not in_group(t, DESCRIBING))


@pytest.mark.parametrize("group", RENDERERS)
def test_renderers_import_no_judging_function(group):
    for name in [n for n in modules() if in_group(n, (group,))]:
        wrong = judging_imports(imports_of(name))
        assert not wrong, f"{name} reaches {wrong}: read the result's findings instead"


@pytest.mark.parametrize(
    "source",
    [
        "from rollout_diag.decisions.verdict import overall_verdict",
        "def f():\n    from rollout_diag.decisions.recommend import recommend\n",
        "import rollout_diag.decisions.analysis",
    ],
)
def test_a_renderer_importing_a_judging_function_is_caught(source):
    targets = set()
    for node in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        else:
            targets.update(
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules() else node.module
                for alias in node.names
            )
    assert judging_imports(targets)


def test_type_checking_imports_of_result_types_are_allowed():
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rollout_diag.decisions.diff import DiffResult\n"
    )
    assert not [node for node in _import_nodes(ast.parse(source)) if "decisions" in (node.module or "")]


# Layers, lowest first: a module imports only from its own layer or lower ones (no arrow climbs back up). Within a
# layer, the module map's own rules above apply.
LAYERS = (
    (
        "rollout_diag.errors",
        "rollout_diag.paths",
        "rollout_diag.progress",
        "rollout_diag.cores",
        "rollout_diag.memory",
        "rollout_diag.lazy",  # a package's names loaded when first read: imports nothing of the package
        "rollout_diag.process",
        "rollout_diag.engine.arrays",  # numpy or torch alike: imports nothing of the package
        "rollout_diag.views",  # where a result finds the views export registers: imports nothing of the package
    ),
    ("rollout_diag.presets", "rollout_diag.catalogue", "rollout_diag.selection"),
    ("rollout_diag.formatting",),  # numbers and data strings as text: imports nothing of the package
    ("rollout_diag.results",),
    ("rollout_diag.glossary",),
    ("rollout_diag.engine.quantities",),  # the token-quantity table the kernels and the engines read
    # compiled CPU code over plain arrays (the reader's scans and the engines' passes), and which engine runs
    ("rollout_diag.engine.kernels", "rollout_diag.engine.choice"),
    ("rollout_diag.engine",),  # how a chunk's numbers are computed fast: the engines and the per-step state
    ("rollout_diag.io",),  # reads files into chunks, which the engines read (engine.stats.ChunkArrays)
    ("rollout_diag.metrics",),
    ("rollout_diag.groups", "rollout_diag.decisions"),
    ("rollout_diag.drivers",),
    # the renderers: they read results and findings (export/: dataframes, Parquet, TensorBoard, W&B, notebook HTML)
    ("rollout_diag.trainers", "rollout_diag.render", "rollout_diag.report", "rollout_diag.export"),
    ("rollout_diag.cli",),
)


def layer_of(name: str) -> int | None:
    ranked = [(len(prefix), rank) for rank, group in enumerate(LAYERS) for prefix in group if in_group(name, (prefix,))]
    return max(ranked)[1] if ranked else None


def test_every_module_has_a_layer():
    assert [name for name in modules() if name != "rollout_diag" and layer_of(name) is None] == []


def test_no_import_climbs_back_up():
    climbs = []
    for name in modules():
        if name == "rollout_diag":  # the package's lazy table of public names (PEP 562) names every layer
            continue
        for target in imports_of(name):
            if target in modules() and target != "rollout_diag" and layer_of(target) > layer_of(name):
                climbs.append((name, target))
    assert sorted(set(climbs)) == []


def test_results_import_no_renderer_at_any_depth():
    """The contract knows no view: export/ and the other renderers read results, and a result's ``to_polars()``,
    ``to_pandas()`` and ``_repr_html_()`` find export's functions in rollout_diag/views.py, where export registers
    them. No import of a renderer in results, at module level, inside a function or for type checking."""
    renderers = ("rollout_diag.export", "rollout_diag.render", "rollout_diag.report")
    for name in [n for n in modules() if in_group(n, ("rollout_diag.results",))]:
        assert not [t for t in imports_of(name, types=True) if in_group(t, renderers)], name


def test_the_views_registry_imports_nothing_of_the_package():
    assert not [t for t in imports_of("rollout_diag.views", types=True) if t.startswith("rollout_diag")]


def test_a_result_finds_its_views_whatever_was_imported():
    """A fresh interpreter that imports only the results package gets its views: the package registers them as it
    loads."""
    code = (
        "import sys\nfrom rollout_diag.results.analysis import AnalysisResult\n"
        "from rollout_diag.views import views_of\n"
        "assert views_of(AnalysisResult.VIEW_KIND).frames.__module__ == 'rollout_diag.export.frames'\n"
        "assert 'rollout_diag.export.notebook' not in sys.modules and 'polars' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# A package module loaded by a name in a string is an arrow neither the walks above nor farm-studio see. Allowed: the
# package's lazy table of public names (PEP 562) and the trainer formats (each a module of io/formats/, found by
# listing the package).
NAMED_LOADS_ALLOWED = {"rollout_diag", "rollout_diag.io.formats"}


def _loads_by_name(tree: ast.AST) -> bool:
    """Whether the code calls ``import_module`` or ``__import__`` on a package module's name or a formatted name."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        argument = node.args[0]
        named = isinstance(argument, ast.Constant) and str(argument.value).startswith("rollout_diag")
        if function in ("import_module", "__import__") and (named or isinstance(argument, ast.JoinedStr)):
            return True
    return False


def test_no_import_detours():
    detours = [name for name, path in modules().items() if _loads_by_name(ast.parse(path.read_text(encoding="utf-8")))]
    assert set(detours) <= NAMED_LOADS_ALLOWED, detours
    assert _loads_by_name(ast.parse('import importlib\nframes = importlib.import_module("rollout_diag.export.frames")'))
    assert not _loads_by_name(ast.parse('features = importlib.import_module("numpy._core._multiarray_umath")'))


def test_the_climb_check_sees_a_climb():
    assert layer_of("rollout_diag.metrics.hints") < layer_of("rollout_diag.decisions.hints")
    assert layer_of("rollout_diag.results") < layer_of("rollout_diag.decisions.intrusive")


def _torch_outside_annotations(tree: ast.AST) -> int:
    """How many ``torch.…`` names the code uses other than in annotations (which ``from __future__ import
    annotations`` never evaluates)."""
    annotations: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.update(id(inner) for inner in ast.walk(node.annotation))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.update(id(inner) for inner in ast.walk(node.returns))
        elif isinstance(node, ast.AnnAssign):
            annotations.update(id(inner) for inner in ast.walk(node.annotation))
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and id(node) not in annotations
    )


def test_torch_is_imported_only_where_torch_runs():
    """A module that imports torch calls it; one that only names it in annotations imports it under TYPE_CHECKING
    (importing torch costs 1–2 s of a fresh process)."""
    idle = []
    for name, path in modules().items():
        if "torch" in imports_of(name):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if _torch_outside_annotations(tree) == 0:
                idle.append(name)
    assert idle == []


def test_the_idle_torch_check_sees_an_annotation_only_use():
    source = "import torch\ndef f(device: torch.device) -> torch.Tensor:\n    x: torch.Tensor = g()\n    return x\n"
    assert _torch_outside_annotations(ast.parse(source)) == 0
    assert _torch_outside_annotations(ast.parse("import torch\nzeros = torch.zeros(3)\n")) == 1


@pytest.mark.parametrize(
    "group",
    [
        "rollout_diag.decisions",
        "rollout_diag.results",
        "rollout_diag.catalogue",
        "rollout_diag.presets",
        "rollout_diag.selection",
        "rollout_diag.render",
        "rollout_diag.report",
        "rollout_diag.export",
        "rollout_diag.engine.kernels",
        "rollout_diag.io.sources",
        "rollout_diag.io.columns",
    ],
)
def test_modules_that_run_no_torch_reach_no_torch(group):
    for name in [n for n in modules() if in_group(n, (group,))]:
        assert "torch" not in reachable(name), name


# Trainer formats: each is one module of io/formats/ that registers itself; nothing else names it.
FORMAT_HELPERS = (
    "rollout_diag.io.formats.base",
    "rollout_diag.io.formats.safe_pickle",
    "rollout_diag.io.formats.registry",
)


def test_every_format_module_registers_itself_and_the_package_names_none():
    from rollout_diag.io.formats import FORMAT_NAMES
    from rollout_diag.io.formats.registry import FORMATS

    format_modules = [
        name for name in modules() if name.startswith("rollout_diag.io.formats.") and name not in FORMAT_HELPERS
    ]
    for name in format_modules:
        source = modules()[name].read_text(encoding="utf-8")
        assert re.search(r"\bregister(_pickle)?\(", source), f"{name} does not register itself"
    assert len(FORMATS) == len(format_modules) and ("parquet", *FORMAT_NAMES[1:]) == FORMAT_NAMES
    package_imports = imports_of("rollout_diag.io.formats")
    assert not [name for name in format_modules if name in package_imports]


def test_a_new_format_is_one_registration(tmp_path):
    """A format registered at run time is detected by its files, read in step order and opened through its own
    ``open_file``: no other module changes."""
    from rollout_diag.io.formats import format_of, open_source, resolve
    from rollout_diag.io.formats.registry import FORMATS, TrainerFormat, register

    opened = []
    fake = TrainerFormat(
        name="fake-rl",
        suffix=".fake",
        described="step_N.fake",
        step_of=lambda path: int(path.stem.split("_")[1]) if path.stem.startswith("step_") else None,
        open_file=lambda path, trust_pickle: opened.append((path, trust_pickle)) or "opened",
        order=99,
        by_name=lambda path: path.stem.startswith("step_"),
    )
    for step in (10, 2):
        (tmp_path / f"step_{step}.fake").write_text("x")
    register(fake)
    try:
        assert format_of(tmp_path / "step_2.fake") == "fake-rl"
        fmt, sources = resolve([str(tmp_path)])
        assert fmt == "fake-rl" and [s.path for s in sources] == [str(tmp_path / f"step_{n}.fake") for n in (2, 10)]
        assert open_source(sources[0], fmt, trust_pickle=True) == "opened" and opened == [(sources[0].path, True)]
    finally:
        del FORMATS["fake-rl"]


def test_the_token_quantity_table_is_stated_once():
    """engine/quantities.py names every quantity the kernels compute; each name has its formula, and the kernels read
    the names from the table (no list of their own)."""
    import rollout_diag.metrics.hints  # noqa: F401  (registers the hint quantities' formulas)
    from rollout_diag.engine import quantities
    from rollout_diag.engine.formulas import TOKEN_QUANTITIES

    named = {*quantities.QUANTITIES, *quantities.EXTREMES, *quantities.PRESET_BASES, *quantities.SHARED_QUANTITIES}
    assert named <= set(TOKEN_QUANTITIES)
    for kernel in ("rollout_diag.engine.kernels.cpu", "rollout_diag.engine.kernels.presets"):
        assert "rollout_diag.engine.quantities" in imports_of(kernel)


# ---------------------------------------------------------------- the tests: shared pieces live in tests/helpers/
TESTS = Path(__file__).resolve().parent


def imported_test_modules(source: str) -> list[str]:
    """The ``test_*`` (and ``conftest``) modules a test source imports, at any depth: what tests share lives in
    tests/helpers/ (builders, references) or tests/conftest.py (fixtures), never in another test module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            name for name in names if any(part.startswith("test_") or part == "conftest" for part in name.split("."))
        ]
    return found


def test_no_test_module_imports_another():
    sources = sorted(path for path in TESTS.rglob("*.py") if ".venv" not in path.parts)
    assert any(path.parent.name == "helpers" for path in sources)
    offenders = {
        str(path.relative_to(TESTS)): found for path in sources if (found := imported_test_modules(path.read_text()))
    }
    assert offenders == {}, "import the shared piece from tests/helpers/ (or a fixture from tests/conftest.py)"


@pytest.mark.parametrize(
    "source",
    ["from test_cli import invoke", "import test_many_steps as many", "def f():\n    from metrics.test_x import y"],
)
def test_a_test_module_importing_another_is_caught(source):
    assert imported_test_modules(source) != []
    assert imported_test_modules("from helpers.cli import invoke\nimport pytest") == []


# The suites that are about the whole package, not one module (they stay at tests/'s top with the top-level modules').
WHOLE_PACKAGE_SUITES = {"architecture", "docs", "imports", "reference", "cuda", "extras", "paths", "groups_check_diff"}


def test_tests_mirror_the_package():
    """A test file sits in the folder of the package it tests (tests/io/ for rollout_diag/io/, …); at tests/'s top only
    the tests of top-level modules (test_presets.py for presets.py; test_where.py for --where, selection.py) and the
    whole-package suites."""
    top_modules = {path.stem for path in (TESTS.parent / "rollout_diag").glob("*.py")} | {"where"}
    packages = {path.name for path in (TESTS.parent / "rollout_diag").iterdir() if any(path.glob("*.py"))}
    stray = [
        path.name
        for path in TESTS.glob("test_*.py")
        if path.stem.removeprefix("test_") not in top_modules | WHOLE_PACKAGE_SUITES
    ]
    assert stray == [], "move these into the tests/ folder of the package they test"
    folders = {path.name for path in TESTS.iterdir() if path.is_dir() and any(path.glob("test_*.py"))}
    # tests/kernels/: rollout_diag/engine/kernels/; tests/cli/: rollout_diag/cli/'s commands
    assert folders <= packages | {"kernels", "cli"}, folders - packages
