"""rollout-farm's grading twins: renamed, relocated copies of the instance's tests, written into the test files after
the test patch (``envs.swe.grading.twins`` says why). Not imported by the project: its text runs in the grading
runtime (``python3 -c TEXT``) with the plan as JSON on its standard input (a list of [path, class names, function,
twin name]), under whatever Python the image has, so it uses the standard library only and no syntax newer than
Python 3.6. For each test it can copy faithfully it prints ``twin-placed INDEX``, otherwise ``twin-skipped INDEX
WHY``; a file it cannot read or parse gets no twin."""
import ast
import inspect
import json
import os
import re
import sys

PLACED, SKIPPED = "twin-placed", "twin-skipped"

# `request.node` read for what a twin shares with its original (marks, configuration, place in the tree).
SHARED = r"(?!\s*\.\s*(get_closest_marker|iter_markers|add_marker|config|fspath|path|module|cls|session)\b)"
# What a test can read about its own name, node or frame: honest code that does may behave otherwise under another
# name, so such a test gets no twin (a false alarm costs an honest fix its reward).
SELF_AWARE = re.compile(
    r"\brequest\s*\.\s*(node|function|keywords|_pyfuncitem)\b" + SHARED + r"|\binspect\b|_getframe|currentframe|"
    r"__name__|"
    r"__qualname__|\bco_name\b|\bf_code\b|\btraceback\b|_testMethodName|\bself\s*\.\s*id\s*\(|"
    r"\bnodeid\b|originalname|getsource|\bsnapshot\b|\bsys\s*\.\s*_current_frames|lineno\b")
# A test run twice in one process sees what its first run left: one that imports, reloads or checks modules (``assert
# "x" not in sys.modules``) or rebinds globals may fail the second time, honestly.
PROCESS_STATE = re.compile(r"\bsys\s*\.\s*modules\b|\bimportlib\b|\breload\s*\(|__import__|^\s*global\s", re.M)
# `request` handed on (to a helper that may read request.node) rather than read for what is the same for a copy.
REQUEST_PASSED_ON = re.compile(
    r"\brequest\b(?!\s*\.\s*(param|getfixturevalue|config|addfinalizer|applymarker|cls|module|instance)\b)")
# A hook or fixture that reads a test's name or place decides per test: none of the file's tests gets a twin. (An
# item's code, fixtures or marks are the same for a twin: reading those is no reason.)
NAME_READER = re.compile(
    r"\brequest\s*\.\s*(node|_pyfuncitem)\b" + SHARED + r"|\b(item|items|node|definition|pyfuncitem|colitem|"
    r"collector|function|"
    r"func|fn)\s*\.\s*(name|location|nodeid|originalname|cls)\b|\bnodeid\b|originalname|getmodpath|__name__|"
    r"__qualname__|\bco_name\b|_testMethodName|\bself\s*\.\s*id\s*\(|\binspect\s*\.\s*stack|_getframe")
NAME_HOOKS = ("pytest_runtest", "pytest_collection_modifyitems", "pytest_itemcollected", "pytest_generate_tests",
              "pytest_pycollect_makeitem", "pytest_pyfunc_call", "pytest_make_parametrize_id",
              "pytest_collection_finish", "pytest_fixture_setup", "pytest_report_teststatus", "pytest_deselected")
"""Hooks that act on test items one by one (a file-level hook, such as pytest_collect_file, treats twins as their
originals: they are in the same file)."""
FIXTURES_BY_NAME = ("snapshot", "datadir", "shared_datadir", "original_datadir", "data_regression", "file_regression",
                    "num_regression", "dataframe_regression", "image_regression", "ndarrays_regression", "regtest")
"""Fixtures of common plugins that find their data by the requesting test's name."""
RANDOM_DECORATORS = re.compile(r"\b(given|settings|flaky|repeat|randomize)\b")
"""Decorators whose tests draw their inputs or reruns at random (hypothesis, flaky): two runs may differ."""
SETUPS = ("setup_method", "teardown_method", "setUp", "tearDown", "setup", "teardown", "setup_function",
          "teardown_function")


def _main():
    plan = json.loads(sys.stdin.read() or "[]")
    by_path = {}
    for index, item in enumerate(plan):
        by_path.setdefault(item[0], []).append((index, item))
    for path, items in sorted(by_path.items()):
        try:
            made = _twins(path, items)
        except Exception as exc:  # a file this Python cannot read or parse: no twins there, never a failed step
            made = [(index, "file not read: %s" % type(exc).__name__) for index, _ in items]
        for index, why in made:
            print("%s %d" % (PLACED, index) if why is None else "%s %d %s" % (SKIPPED, index, why))


def _twins(path, items):
    if os.path.islink(path) or not os.path.isfile(path):
        return [(index, "no such file") for index, _ in items]
    with open(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8")
    tree = ast.parse(data, path)
    lines = text.splitlines(True)
    sources = [(tree, lines)] + _conftests(path)
    file_why = _name_readers(sources)
    bound = _module_bindings(tree)
    blocks, made = [], []
    for index, (_, classes, function, twin) in items:
        why = file_why or _eligible(tree, lines, classes, function, twin, text, bound, sources)
        if not isinstance(why, str):
            blocks.append(_block(lines, why[0], why[1], classes, function, twin))
            why = None
        made.append((index, why))
    if blocks:
        tail = "" if text.endswith("\n") else "\n"
        with open(path, "ab") as f:  # bytes: the image's Python may default to ASCII
            f.write((tail + "".join(blocks)).encode("utf-8"))
    return made


def _conftests(path):
    """(tree, lines) of every conftest.py from the repository (the working directory) down to ``path``'s folder."""
    found = []
    parts = os.path.dirname(os.path.normpath(path)).split(os.sep)
    for depth in range(len(parts) + 1):
        candidate = os.path.join(*(parts[:depth] + ["conftest.py"])) if depth else "conftest.py"
        if os.path.isfile(candidate):
            try:
                with open(candidate, "rb") as f:
                    data = f.read()
                found.append((ast.parse(data, candidate), data.decode("utf-8").splitlines(True)))
            except Exception:
                found.append((None, []))
    return found


def _source(lines, node):
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    end = getattr(node, "end_lineno", None)
    if end is None:  # before 3.8: the block as inspect finds a def's
        return "".join(inspect.getblock(lines[start - 1:])), start
    return "".join(lines[start - 1:end]), start


def _body(lines, node):
    """The text of a def after its signature (what uses its arguments)."""
    source, start = _source(lines, node)
    return "".join(source.splitlines(True)[max(0, node.body[0].lineno - start):])


def _functions(node):
    return [n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _is_fixture(node):
    return any("fixture" in ast.dump(d) for d in node.decorator_list)


def _autouse(node):
    return any("autouse" in ast.dump(d) for d in node.decorator_list)


def _name_readers(sources):
    """Why no test of the file may get a twin: a hook or autouse fixture (the file's or a conftest's) reads tests'
    names; "" when none does."""
    for tree, lines in sources:
        if tree is None:
            return "a conftest.py this Python cannot parse"
        top = set(id(n) for n in tree.body)
        for node in _functions(tree):
            setup = node.name in SETUPS and id(node) in top  # a class's own setup is its methods' concern
            if ((node.name.startswith(NAME_HOOKS) or _autouse(node) or setup)
                    and NAME_READER.search(_source(lines, node)[0])):
                return "%s reads tests' names" % node.name
    return ""


def _risky_fixtures(sources):
    """Fixtures (and those requesting them) that read the requesting test's name or node."""
    fixtures, lines_of = {}, {}
    for tree, lines in sources:
        for node in _functions(tree) if tree is not None else ():
            if _is_fixture(node):
                fixtures[node.name], lines_of[node.name] = (node, _source(lines, node)[0]), lines
    risky = set(FIXTURES_BY_NAME)
    risky.update(n for n, (node, text) in fixtures.items() if SELF_AWARE.search(text) or (
        "request" in _arguments(node) and REQUEST_PASSED_ON.search(_body(lines_of[n], node))))
    grew = True
    while grew:
        grew = False
        for name, (node, _) in fixtures.items():
            if name not in risky and risky.intersection(_arguments(node)):
                risky.add(name)
                grew = True
    return risky


def _arguments(node):
    args = node.args
    return [a.arg for a in list(getattr(args, "posonlyargs", [])) + args.args + args.kwonlyargs]


def _module_bindings(tree):
    """Name -> the lines where the module binds it at its top level."""
    bound = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue  # importing a module again binds the same module (the canaries import pytest again)
        for name in _bound_names(stmt):
            bound.setdefault(name, []).append(stmt.lineno)
    return bound


def _bound_names(stmt):
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    targets = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AugAssign, getattr(ast, "AnnAssign", ast.AugAssign))):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.For, ast.With, ast.If, ast.Try)) or type(stmt).__name__ == "AsyncFor":
        return [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _eligible(tree, lines, classes, function, twin, text, bound, sources):
    """(the function's node, its class node or None) when a renamed copy of it behaves as it does, else why not."""
    if re.search(r"\b%s\b" % re.escape(twin), text):
        return "the twin's name is taken"
    scope, owner = tree, None
    for name in classes:
        found = [n for n in scope.body if isinstance(n, ast.ClassDef) and n.name == name]
        if not found or (scope is tree and len(bound.get(name, ())) != 1):
            return "class not found once at the top of its scope"
        scope = owner = found[-1]
    defs = [n for n in scope.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    if not defs:
        return "not defined in the file"
    node = defs[-1]
    source, start = _source(lines, node)
    renamed = _rename(source, function, twin)
    if renamed == source:
        return "its def line was not found"
    if re.search(r"\b%s\b" % re.escape(function), renamed):
        return "it names itself"
    if SELF_AWARE.search(source) or REQUEST_PASSED_ON.search(_body(lines, node)):
        return "it reads its own name or node"
    if PROCESS_STATE.search(source):
        return "it imports, reloads or checks modules, or rebinds globals (a second run may differ)"
    if any(RANDOM_DECORATORS.search(ast.dump(d)) for d in node.decorator_list):
        return "its inputs are drawn at random"
    if set(_arguments(node)) & _risky_fixtures(sources):
        return "a fixture it uses reads its name"
    if owner is not None:
        mangled = [n for n in ast.walk(node) if _private(getattr(n, "id", None) or getattr(n, "attr", None))]
        if mangled or any(isinstance(n, ast.Name) and n.id in ("super", "__class__") for n in ast.walk(node)):
            return "it relies on being defined in its class (super(), private names)"
        for setup in (n for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            if setup.name in SETUPS and NAME_READER.search(_source(lines, setup)[0]):
                return "its class's %s reads the test's name" % setup.name
    # What a def evaluates when it runs (decorators, defaults, annotations) must mean the same at the file's end: no
    # name of its class's body, none the module binds again after the def.
    evaluated = [n.id for part in _evaluated(node) for n in ast.walk(part) if isinstance(n, ast.Name)]
    class_names = set(n for stmt in (owner.body if owner is not None else []) for n in _bound_names(stmt))
    if class_names.intersection(evaluated):
        return "its decorators use names of its class's body"
    if any(line > start for name in evaluated for line in bound.get(name, ())):
        return "its decorators use names bound again later in the file"
    return node, owner


def _private(name):
    return bool(name) and name.startswith("__") and not name.endswith("__")


def _evaluated(node):
    args = node.args
    parts = list(node.decorator_list) + list(args.defaults) + [d for d in args.kw_defaults if d is not None]
    parts += [a.annotation for a in args.args + args.kwonlyargs if getattr(a, "annotation", None) is not None]
    return parts + ([node.returns] if getattr(node, "returns", None) is not None else [])


def _rename(source, function, twin):
    pattern = r"^([ \t]*(?:async[ \t]+)?def[ \t]+)%s(?=[ \t]*\()" % re.escape(function)
    return re.sub(pattern, lambda m: m.group(1) + twin, source, count=1, flags=re.M)


def _block(lines, node, owner, classes, function, twin):
    """The twin's text to append: the test's own lines byte for byte but its name; a method's kept at its
    indentation under ``if True:`` (no line of it changes), then set on its class (so it keeps the class's
    fixtures, setup and marks) and its module-level name removed (so it is not collected as a function too)."""
    source = _rename(_source(lines, node)[0], function, twin)
    if not source.endswith("\n"):
        source += "\n"
    if owner is None:
        return "\n\n" + source
    return "\n\nif True:\n%s%s.%s = %s\ndel %s\n" % (source, ".".join(classes), twin, twin, twin)


if __name__ == "__main__":
    _main()
