"""rollout-farm's grading launcher: pytest configured as the repository was before the patch, with the copies of
modules the harness's own command imports (``envs.swe.grading.pytest_launch`` says how). Not imported by the project:
its text is copied into the grading runtime and run there as a script (``PYTHONPATH=BOOT python pytest_launcher.py
ARGS...``), under whatever Python the image has, so it uses the standard library only and no syntax newer than
Python 3.6."""
import os
import sys
from importlib.machinery import PathFinder

SELF = ("pytest", "_pytest")
"""pytest's own top-level modules: when the repository's copy runs, its configuration is found by the repository's
code, which the grader does not use for its own ends."""


def _main():
    env = os.environ
    here = os.path.dirname(os.path.realpath(__file__))
    boot = os.path.realpath(env.get("ROLLOUT_GRADE_BOOT") or here)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") not in (here, boot)]
    repo = os.path.realpath(env.get("ROLLOUT_GRADE_REPO") or os.getcwd())
    mirror = env.get("ROLLOUT_GRADE_MIRROR") or ""
    tag = env.get("ROLLOUT_GRADE_TAG") or "x"
    form = env.pop("ROLLOUT_GRADE_FORM", "m")
    row_path = env.pop("ROLLOUT_GRADE_PYTHONPATH", "")
    had_path = env.pop("ROLLOUT_GRADE_HAS_PATH", "")
    runner = env.pop("ROLLOUT_GRADE_RUNNER", "pytest")
    env.pop("PYTHONPATH", None)

    def inside(path):
        path = os.path.realpath(path or ".")
        return path == repo or path.startswith(repo.rstrip(os.sep) + os.sep)

    cwd = os.getcwd()
    row = [os.path.abspath(p) if p else cwd for p in row_path.split(os.pathsep)] if row_path else []
    full = list(sys.path)
    # sys.path as the harness's own command has it: the working directory first for -m, then PYTHONPATH.
    sys.path[:] = ([cwd] if form == "m" else []) + row + [p for p in full if p not in row]
    guard = BaseOnly([p for p in full if not inside(p)], inside, _base_modules(env.pop("ROLLOUT_GRADE_BASE", "")))
    loaded = set(sys.modules)
    if runner == "unittest":
        _unittest(guard, loaded, env.pop("ROLLOUT_GRADE_MODE_FILE", ""), row_path if had_path else None)
    with guard:
        import pytest
        _preload(guard)
    own = _own(guard, loaded)
    _record(env.pop("ROLLOUT_GRADE_MODE_FILE", ""), own)
    if had_path:
        env["PYTHONPATH"] = row_path
    args = list(sys.argv[1:])
    # The base configuration is found by pytest's own code: not when that code is the repository's.
    made = [] if set(own) & set(SELF) else _configure(args, repo, mirror, tag, cwd, inside)
    _pin_plugins(mirror, inside, guard, own)
    sys.argv[:] = [getattr(pytest, "__file__", "pytest")] + made + args
    try:
        code = pytest.main()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (as pytest's own entry point does: no second error at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    finally:
        for path in made[1:2]:
            try:
                os.remove(path)
            except OSError:
                pass
    sys.exit(code)


def _unittest(guard, loaded, mode_file, row_path):
    """``python -m unittest ARGS``: the standard library's runner, never a ``unittest`` the patch adds (no start-up
    file from the repository either); the code under test imports as under the harness's command. Exits."""
    with guard:
        import unittest
    _record(mode_file, _own(guard, loaded))
    if row_path is not None:
        os.environ["PYTHONPATH"] = row_path
    sys.argv[:] = [sys.executable + " -m unittest"] + sys.argv[1:]
    unittest.main(module=None)  # TestProgram: exits with the run's status


def _own(guard, loaded):
    """The top-level modules loaded since ``loaded`` that are the repository's own."""
    new = [(n, sys.modules[n]) for n in set(sys.modules) - loaded]
    return sorted(set(n.partition(".")[0] for n, m in new if guard.owns(getattr(m, "__spec__", None))))


class BaseOnly(object):
    """A meta path finder, first while the launcher imports pytest, its plugins and what they need. A top-level
    module that sys.path finds in the repository but that was not there before the patch is taken from outside
    the repository instead: a module the patch adds cannot stand in for one of pytest's. Every other import is
    left to the usual finders, so a module the repository had (the code under test, even when it is pluggy or
    pytest itself) is the copy the harness's own command imports. Without the list of the repository's modules
    before the patch, no module of the repository is taken as its own."""

    def __init__(self, outside, inside, base):
        self.outside, self.inside, self.base = outside, inside, base

    def __enter__(self):
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return False

    def find_spec(self, name, path=None, target=None):
        if path is not None or "." in name:
            return None  # a submodule comes from its package's own directory
        spec = PathFinder.find_spec(name, sys.path)
        if spec is None or not self._in_repository(spec) or self._had(spec):
            return None
        return PathFinder.find_spec(name, self.outside)

    def owns(self, spec):
        """Whether the module of ``spec`` is the repository's, one it had before the patch."""
        return spec is not None and self._in_repository(spec) and self._had(spec)

    def _places(self, spec):
        return [p for p in [spec.origin] + list(spec.submodule_search_locations or [])
                if p and os.path.isabs(p)]

    def _in_repository(self, spec):
        return any(self.inside(p) for p in self._places(spec))

    def _had(self, spec):
        return self.base is not None and any(os.path.realpath(p) in self.base for p in self._places(spec))


def _base_modules(path):
    """The repository's module files and directories before the patch (absolute real paths, one per line, as
    the snapshot listed them); None when there is no list."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as listed:
            return set(line.rstrip("\n") for line in listed)
    except OSError:
        return None


def _record(path, own):
    """One line for the grader (appended: a test command may run pytest more than once): ``isolated``, or
    ``harness`` and the repository's modules that pytest and its plugins loaded."""
    if not path:
        return
    try:
        with open(path, "a") as out:
            out.write(("harness " + " ".join(own) if own else "isolated") + "\n")
    except OSError:
        pass


def _preload(guard):
    """pytest's own plugins and the packages it needs, loaded while ``guard`` is on (what its plugins import at
    their top comes with them); none that is the repository's own (the code under test loads when the tests do)."""
    import importlib

    names = ["pluggy", "iniconfig", "py", "tomli", "exceptiongroup", "_pytest.config", "_pytest.config.findpaths"]
    try:
        import _pytest.config as config
        plugins = list(getattr(config, "essential_plugins", ())) + list(getattr(config, "default_plugins", ()))
        names += ["_pytest." + n for n in plugins if "." not in n]
    except Exception:
        pass
    for name in names:
        top = name.partition(".")[0]
        if top not in sys.modules:
            spec = PathFinder.find_spec(top, sys.path)
            if spec is not None and guard.owns(spec):
                continue
        try:
            importlib.import_module(name)
        except Exception:
            pass



def _configure(args, repo, mirror, tag, cwd, inside):
    """['-c', COPY, '--rootdir', DIR]: the configuration pytest finds for ``args`` among the files as they were
    before the patch (a mirror of them), copied beside the original under a new name; [] when it cannot tell."""
    if not mirror or not os.path.isdir(mirror) or not inside(cwd):
        return []  # a pytest the tests start elsewhere (a temporary project of their own) reads its own files
    try:
        from _pytest.config import findpaths
    except Exception:
        return []
    explicit, rootdir, paths = None, None, []
    pending = None
    for arg in args:
        if pending is not None:
            if pending in ("-c", "--config-file", "--inifile"):
                explicit = arg
            elif pending == "--rootdir":
                rootdir = arg
            pending = None
            continue
        if arg in ("-c", "--config-file", "--inifile", "--rootdir", "-p", "-k", "-m", "-o", "--override-ini",
                   "--tb", "-W", "--deselect", "--ignore", "--ignore-glob", "--durations", "--maxfail", "-n"):
            pending = arg
        elif arg.startswith(("--config-file=", "--inifile=", "--rootdir=")):
            key, _, value = arg.partition("=")
            explicit, rootdir = (value, rootdir) if key != "--rootdir" else (explicit, value)
        elif not arg.startswith("-"):
            paths.append(arg)
    if explicit is not None:
        args[:] = _without_options(args, ("-c", "--config-file", "--inifile"))
    view = lambda p: mirror + os.path.abspath(p)  # noqa: E731 - the mirror's place of a real path
    real_cwd = cwd
    mirrored = []
    for arg in paths:
        part = arg.split("::", 1)[0]
        real = os.path.join(real_cwd, part)
        if not os.path.exists(real):
            continue
        target = view(real)
        try:
            if os.path.isdir(real):
                if not os.path.isdir(target):
                    os.makedirs(target)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if not os.path.exists(target):
                    open(target, "a").close()
        except OSError:
            return []
        mirrored.append(target + arg[len(part):])
    if explicit is not None:
        chosen = view(os.path.join(real_cwd, explicit))
        if inside(os.path.join(real_cwd, explicit)) and not os.path.isfile(chosen):
            return []
        explicit_m = chosen if inside(os.path.join(real_cwd, explicit)) else os.path.join(real_cwd, explicit)
    else:
        explicit_m = None
    os.makedirs(view(real_cwd), exist_ok=True)
    here = os.getcwd()
    try:
        os.chdir(view(real_cwd))
        found = _determine(findpaths, explicit_m, mirrored, rootdir and view(os.path.join(real_cwd, rootdir)),
                           view(real_cwd))
    except Exception:
        return []
    finally:
        os.chdir(here)
    root, inifile = (str(found[0]) if found[0] is not None else None), (str(found[1]) if found[1] else None)
    back = lambda p: p[len(mirror):] if p and p.startswith(mirror + os.sep) else p  # noqa: E731
    root = back(root)
    if root is None or not os.path.isdir(root):
        return []
    if inifile is None:
        source, folder, suffix = None, root, ".ini"
    else:
        source, folder = inifile, os.path.dirname(back(inifile))
        suffix = os.path.splitext(inifile)[1] or ".ini"
        if not os.path.isdir(folder):
            return []
    copy = os.path.join(folder, ".rollout-grade-" + tag + suffix)
    try:
        with open(copy, "wb") as out:
            if source is not None:
                with open(source, "rb") as original:
                    out.write(original.read())
    except OSError:
        return []
    return ["-c", copy, "--rootdir", root]


def _determine(findpaths, inifile, args, rootdir, invocation_dir):
    import inspect

    given = {"inifile": inifile, "args": args, "rootdir_cmd_arg": rootdir, "override_ini": None, "config": None}
    try:
        from pathlib import Path
        given["invocation_dir"] = Path(invocation_dir)
    except Exception:
        pass
    params = inspect.signature(findpaths.determine_setup).parameters
    return findpaths.determine_setup(**{k: v for k, v in given.items() if k in params})


def _without_options(args, names):
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif not any(arg.startswith(n + "=") for n in names if n.startswith("--")):
            out.append(arg)
    return out


def _pin_plugins(mirror, inside, guard, own):
    """setuptools plugins only from metadata outside the repository or unchanged since before the patch; their
    modules loaded with ``guard`` on. Nothing of this in a module the repository has (``own``): its code is what
    the tests test."""
    def allowed(dist):
        where = getattr(dist, "_path", None)
        if where is None or not inside(str(where)):
            return True
        now = os.path.join(str(where), "entry_points.txt")
        if not os.path.isfile(now):
            return True
        then = mirror + os.path.abspath(now)
        try:
            with open(now, "rb") as a, open(then, "rb") as b:
                return a.read() == b.read()
        except OSError:
            return False

    for module_name in ("importlib.metadata", "importlib_metadata"):
        if module_name.partition(".")[0] in own:
            continue
        try:
            module = __import__(module_name, fromlist=["distributions"])
        except Exception:
            continue
        original = getattr(module, "distributions", None)
        if original is None:
            continue

        def distributions(*a, __original=original, **k):
            return (d for d in __original(*a, **k) if allowed(d))
        module.distributions = distributions
    if "pluggy" in own:
        return
    try:
        import pluggy
        manager = pluggy.PluginManager
        load = manager.load_setuptools_entrypoints
    except Exception:
        return

    def load_guarded(self, group, name=None):
        # A module the patch adds cannot stand in for a plugin the image has; a plugin the repository itself
        # registered (its own, from metadata unchanged since before the patch) loads as the harness loads it.
        with guard:
            return load(self, group, name)
    manager.load_setuptools_entrypoints = load_guarded


if __name__ == "__main__":
    _main()
