"""The layers hold: rollout/ (the core) imports nothing from envs, agents, cluster or ray, directly or by a string
naming a module; envs and agents never import each other; only cluster/ imports ray. Inside cluster/ the parts point
one way (entry → assembly → workers | serving → session, no cycle between folders), and the drawn graph is the
running one: project imports sit at the top of their modules (inside a function only in cluster/cli/, for a fast
``--help``, or for a module that needs an optional extra such as Ray). And the folders stay readable: each README
names every module of its folder and no module that is gone. A folder of more than 12 modules or a module of more
than 250 lines is printed as a hint (split where the names part, not to fit a count), never a failure."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollout", "agents", "envs", "cluster")
SIZED = (*PACKAGES, "examples", "tests")  # package folders whose size is capped (modules per folder)
MAX_MODULES_PER_FOLDER = 12  # __init__.py counts
MAX_LINES_PER_MODULE = 250
RUNTIME_SCRIPTS = {"envs/swe/grading/pytest_launcher.py", "envs/swe/grading/twin_maker.py"}
"""Never imported: each is copied whole, as text, into a grading runtime and run there as one self-contained
script (standard library only), so it is one file by necessity, not a module to cut by length."""
MODULE_STRING = re.compile(r"^(?P<top>envs|agents|cluster|ray)(\.[A-Za-z_][\w.]*)?(:\w+)?$")


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imports_of(path: Path) -> list[tuple[str, int, str]]:
    """(top-level module, line, how) for every import and every string constant that names a module path."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno, "import") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno, "import"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = MODULE_STRING.match(node.value)
            if match and ("." in node.value or ":" in node.value):
                found.append((match["top"], node.lineno, f"string {node.value!r}"))
    return found


def offences(package: str, forbidden: set[str]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {how} ({top})" for path in sources(package)
            for top, line, how in imports_of(path) if top in forbidden]


@pytest.mark.parametrize("package, forbidden", [
    ("rollout", {"envs", "agents", "cluster", "ray"}),
    ("envs", {"agents", "cluster", "ray"}),
    ("agents", {"envs", "cluster", "ray"}),
])
def test_a_lower_layer_never_reaches_up(package, forbidden):
    assert sources(package), f"no sources under {package}/"
    assert offences(package, forbidden) == []


def test_only_cluster_imports_ray():
    users = {path.relative_to(ROOT).parts[0] for package in PACKAGES for path in sources(package)
             if any(top == "ray" and how == "import" for top, _line, how in imports_of(path))}
    assert users <= {"cluster"}, users
    assert "cluster" in users  # the check looks at real imports: the farm does import ray


def test_the_checker_sees_imports_and_module_strings(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import envs.runtimes.docker.runtime\nfrom agents import x\nPATH = "cluster.run.job:prepare"\n'
                     'TEXT = "agents are strategies"\n')
    assert [(top, how.split()[0]) for top, _line, how in imports_of(probe)] == [
        ("envs", "import"), ("agents", "import"), ("cluster", "string")]


def folders(top: str) -> list[Path]:
    """``top`` and every folder under it, without caches and hidden folders."""
    below = [path for path in (ROOT / top).rglob("*") if path.is_dir()]
    hidden = (".", "__pycache__")
    return [ROOT / top, *sorted(path for path in below
                                if not any(part.startswith(hidden) for part in path.relative_to(ROOT).parts))]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_file_is_named_in_its_folders_readme(package):
    """Each folder's README (or, for a small subfolder, its parent's) names every module in it."""
    missing = []
    for folder in folders(package):
        text = "".join((d / "README.md").read_text() for d in (folder, folder.parent) if (d / "README.md").exists())
        missing += [f"{path.relative_to(ROOT)}" for path in folder.glob("*.py") if path.name != "__init__.py"
                    and not re.search(rf"\b{re.escape(path.stem)}\b", text)]
    assert missing == []


PY_NAME = re.compile(r"(?<![\w./-])((?:[\w-]+/)*\w+\.py)\b")
FOREIGN = {"conftest.py", "setup.py", "sitecustomize.py", "usercustomize.py"}  # files of the repositories we grade


def exists_from(folder: Path, name: str) -> bool:
    return ((folder / name).exists() or (ROOT / name).exists()
            or ("/" not in name and any(folder.rglob(name))))


@pytest.mark.parametrize("package", [*PACKAGES, "tests"])
def test_readmes_name_no_module_that_is_gone(package):
    """A ``name.py`` a README mentions exists: beside the README, under it, or as a path from the repository root."""
    stale = []
    for folder in folders(package):
        readme = folder / "README.md"
        if not readme.exists():
            continue
        for number, line in enumerate(readme.read_text().splitlines(), 1):
            stale += [f"{readme.relative_to(ROOT)}:{number}: {name}" for name in PY_NAME.findall(line)
                      if name not in FOREIGN and not exists_from(folder, name)]
    assert stale == []


def test_sizes_are_hints_printed_not_limits(capsys):
    """Large folders and modules are named (a place to look for two concepts in one), never failed: a module is
    split where its names part, and left whole where they do not."""
    crowded = {f"{folder.relative_to(ROOT)}/": count for top in SIZED for folder in folders(top)
               if (count := len(list(folder.glob("*.py")))) > MAX_MODULES_PER_FOLDER}
    long = {f"{path.relative_to(ROOT)}": lines for top in SIZED if top != "tests" for folder in folders(top)
            for path in folder.glob("*.py") if (lines := len(path.read_text().splitlines())) > MAX_LINES_PER_MODULE
            and str(path.relative_to(ROOT)) not in RUNTIME_SCRIPTS}
    with capsys.disabled():
        for name, count in sorted(crowded.items()):
            print(f"\nhint: {name} holds {count} modules (over {MAX_MODULES_PER_FOLDER}): two parts in one folder?")
        for name, lines in sorted(long.items()):
            print(f"\nhint: {name} has {lines} lines (over {MAX_LINES_PER_MODULE}): two concepts in one module?")


@pytest.mark.parametrize("folder, forbidden", [
    ("envs/swe/logs", ("envs.swe.rows", "envs.swe.grading", "envs.swe.reports")),
    ("envs/swe/rows", ("envs.swe.grading", "envs.swe.reports")),
    ("envs/swe/reports", ("envs.swe.grading",)),
    ("envs/runtimes/docker", ("envs.runtimes.apptainer",)),
    ("envs/runtimes/apptainer", ("envs.runtimes.docker",)),
])
def test_subfolders_import_one_way(folder, forbidden):
    """Inside a package the parts point one way too: a lower part never imports one that builds on it (the
    grader reads rows, logs and reports; none of them reads the grader back)."""
    names = re.compile(r"^\s*(?:from|import)\s+(" + "|".join(re.escape(f) for f in forbidden) + r")\b", re.M)
    found = [f"{path.relative_to(ROOT)}: {match}" for path in sorted((ROOT / folder).rglob("*.py"))
             for match in names.findall(path.read_text())]
    assert found == []


# ---- cluster/: parts with rules between them -------------------------------------------------------------------

PARTS = {
    "entry": {"cli", "run", "farm", "gym", "web", "__main__", "__init__"},
    "assembly": {"assembly", "compose", "names", "backends", "config"},
    "gateway": {"gateway"},
    "workers": {"workers", "placement", "transfer"},
    "serving": {"serving"},
    "session": {"session"},
}
"""cluster/'s units (a folder, or a module at its top) in the parts they make up, from the top down."""
LOWER_THAN_ASSEMBLY = ("workers", "serving", "session")
REACH_ONLY_THROUGH_THE_ASSEMBLY = {"run", "farm", "gym", "web"}
"""The entry folders that open farms: they reach serving, sessions and workers through the assembly, never
directly."""
CLI_TOOLS = {"cli/main.py": {"serving"}, "cli/serve.py": {"serving"}, "cli/metrics.py": {"session"},
             "cli/dev_cluster.py": {"session"}, "cli/status.py": {"session"}, "cli/check_tasks.py": {"session"}}
"""CLI commands that are tools over one lower part itself (``rollout fake-server``, ``models tiny``, ``metrics``,
``dev-cluster``, where runs live): they may import that part."""


def part_of(unit: str) -> str:
    return next(part for part, units in PARTS.items() if unit in units)


def unit_of(module: str) -> str | None:
    """The cluster/ unit a dotted module name is in (``cluster.run.job`` → ``run``), None outside cluster/."""
    parts = module.split(".")
    return parts[1] if parts[0] == "cluster" and len(parts) > 1 else None


def cluster_arrows(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, where) for every import between two units of cluster/, wherever it sits."""
    arrows = []
    for path in sorted((root / "cluster").rglob("*.py")):
        rel = path.relative_to(root / "cluster")
        me = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                unit = unit_of(name)
                if unit and unit != me:
                    arrows.append((me, unit, f"cluster/{rel}:{node.lineno}"))
    return arrows


def part_offences(arrows: list[tuple[str, str, str]]) -> list[str]:
    """Every arrow that breaks a rule between the parts (item by item, with where it is)."""
    found = []
    for src, dst, where in arrows:
        here, there = part_of(src), part_of(dst)
        if there == "entry" and here != "entry":
            found.append(f"{where}: {src} ({here}) imports the entry part ({dst})")
        if {here, there} == {"serving", "workers"}:
            found.append(f"{where}: serving and workers never import each other ({src} -> {dst})")
        if here == "gateway" and there != "gateway":
            found.append(f"{where}: gateway is a leaf; it imports {dst}")
        if here == "session" and there != "session":
            found.append(f"{where}: session is the floor; it imports {dst}")
        if here in LOWER_THAN_ASSEMBLY and dst in {"assembly", "config", "compose"}:
            found.append(f"{where}: {src} ({here}) imports {dst}, which builds on it")
        if src in REACH_ONLY_THROUGH_THE_ASSEMBLY and there in LOWER_THAN_ASSEMBLY:
            found.append(f"{where}: {src} reaches {dst} directly (open a farm through cluster.assembly)")
        if src == "cli" and there in LOWER_THAN_ASSEMBLY:
            module = "/".join(where.split(":")[0].split("/")[1:])
            if there not in CLI_TOOLS.get(module, set()):
                found.append(f"{where}: {module} reaches {dst} directly (only the tool commands of CLI_TOOLS may)")
    return found


def cycles(arrows: list[tuple[str, str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit: units that import each other, however indirectly."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in arrows:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_unit_of_cluster_is_in_a_part():
    units = {p.name if p.is_dir() else p.stem for p in (ROOT / "cluster").iterdir()
             if (p.is_dir() and any(p.glob("*.py"))) or p.suffix == ".py"}
    assert units - set().union(*PARTS.values()) == set()


def test_cluster_parts_point_one_way():
    assert part_offences(cluster_arrows()) == []


def test_no_two_cluster_folders_import_each_other():
    assert cycles(cluster_arrows()) == []


def test_the_part_checker_finds_each_kind_of_offence():
    planted = [("serving", "run", "cluster/serving/x.py:1"), ("workers", "serving", "cluster/workers/x.py:1"),
               ("session", "names", "cluster/session/x.py:1"), ("transfer", "config", "cluster/transfer/x.py:1"),
               ("farm", "workers", "cluster/farm/x.py:1"), ("cli", "session", "cli/run_x.py:1"),
               ("assembly", "workers", "cluster/assembly/x.py:1")]
    found = part_offences([(s, d, w.replace("cli/", "cluster/cli/")) for s, d, w in planted])
    assert len(found) == 6 and not any("cluster/assembly/x.py" in f for f in found), found
    assert cycles([("a", "b", ""), ("b", "c", ""), ("c", "a", ""), ("c", "d", "")]) == [["a", "b", "c"]]


# ---- imports at the top -----------------------------------------------------------------------------------------

OPTIONAL = {"ray", "vllm", "docker", "fastapi", "uvicorn", "starlette", "matplotlib", "swebench", "datasets",
            "torch", "transformers", "numpy", "pyarrow", "pandas"}
"""Packages of the extras (``ray``, ``docker``, ``gym``, ``report``, ``swe``, ``cpu-llm``): the farm runs without
them, so a module that needs one is imported where it is used."""


def top_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is imported (its body, ``if``/``try`` blocks included; not
    ``TYPE_CHECKING`` blocks)."""
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                walk(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body + node.orelse + node.finalbody)

    walk(ast.parse(path.read_text(), str(path)).body)
    return found


def module_path(name: str, root: Path = ROOT) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def needs_an_extra(name: str, root: Path = ROOT, seen: set[str] | None = None) -> bool:
    """Importing ``name`` (a project module) imports a package of an extra, directly or through its top imports."""
    seen = set() if seen is None else seen
    if name in seen:
        return False
    seen.add(name)
    path = module_path(name, root)
    if path is None:
        return False
    for imported in top_imports(path):
        top = imported.split(".")[0]
        if top in OPTIONAL or (top in PACKAGES and needs_an_extra(imported, root, seen)):
            return True
    return False


def hidden_imports(root: Path = ROOT) -> list[str]:
    """Function-local imports of project modules outside cluster/cli/ that no extra explains. (``cluster/__init__``
    is the CLI's too: every ``rollout`` command imports the package, which loads ``RolloutFarm`` on first use.)"""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = str(path.relative_to(root))
            if rel.startswith("cluster/cli/") or rel in RUNTIME_SCRIPTS | {"cluster/__init__.py"}:
                continue
            tree = ast.parse(path.read_text(), rel)
            for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        imports = [(a.name, [a.name]) for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        imports = [(node.module, [node.module, *(f"{node.module}.{a.name}" for a in node.names)])]
                    else:
                        continue
                    for name, modules in imports:
                        if name.split(".")[0] in PACKAGES and not any(needs_an_extra(m, root) for m in modules):
                            found.append(f"{rel}:{node.lineno}: {name}")
    return sorted(set(found))


def test_project_imports_sit_at_the_top():
    """An import inside a function is a name on the wrong floor, unless it is the CLI's (a fast ``--help``) or the
    module needs an extra the farm runs without (Ray, docker, ...)."""
    assert hidden_imports() == []


def test_the_import_checker_sees_a_hidden_import(tmp_path):
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "a.py").write_text("def f():\n    from rollout import b\n")
    (tmp_path / "rollout" / "b.py").write_text("X = 1\n")
    (tmp_path / "rollout" / "c.py").write_text("def g():\n    from rollout import d\n")
    (tmp_path / "rollout" / "d.py").write_text("import ray\n")
    (tmp_path / "cluster" / "cli").mkdir(parents=True)
    (tmp_path / "cluster" / "cli" / "m.py").write_text("def h():\n    from rollout import b\n")
    for package in ("envs", "agents"):
        (tmp_path / package).mkdir()
    assert hidden_imports(tmp_path) == ["rollout/a.py:2: rollout"]


NO_RAY = """
import builtins, sys
real = builtins.__import__
def refuse(name, *args, **kwargs):
    if name == "ray" or name.startswith("ray."):
        raise ImportError("No module named 'ray' (refused by the test)")
    return real(name, *args, **kwargs)
builtins.__import__ = refuse
import cluster.run.job, cluster.farm.rollout_farm, cluster.assembly, cluster.cli.main
assert "ray" not in sys.modules
"""


def test_a_farm_opens_on_the_local_backend_without_ray():
    """Ray is an extra: the run job, ``RolloutFarm`` and the assembly import without it (``ray`` is imported inside
    the functions that use it, so ``farm.backend: local`` works on a machine without Ray)."""
    done = subprocess.run([sys.executable, "-c", NO_RAY], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
