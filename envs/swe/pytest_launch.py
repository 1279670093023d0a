"""pytest on the base commit's terms: the shell functions that catch the test command's pytest, the snapshot of
what pytest reads that is taken before the patch, and the launcher that runs pytest from them.

A patch may add or change any file of the repository, and ``python -m pytest`` from the repository root puts it
first on ``sys.path``. So when the test command runs pytest (``pytest``, ``py.test``, ``python[3] -m pytest``, with
interpreter options), it runs through ``LAUNCHER`` instead, which:

- starts the interpreter with the row's ``PYTHONPATH`` held back and only a directory of ours on it, whose
  ``sitecustomize`` / ``usercustomize`` run the image's own from outside the repository (no start-up file a patch
  wrote runs, whatever path the row adds or an editable install's ``.pth`` puts on ``sys.path``; and no ``-S``,
  which multiprocessing would pass on to its children);
- imports pytest, its own plugins and pluggy with no directory of the repository on ``sys.path`` (a module the patch adds cannot stand in for them), then puts ``sys.path`` back as the command
  would have had it (the working directory first for ``-m``, the row's ``PYTHONPATH``), so the code under test
  imports as it always did;
- loads setuptools plugins (``pytest11`` entry points) only from package metadata that is outside the repository,
  or inside it byte for byte as before the patch, and with the repository last on ``sys.path`` while it does;
- gives pytest its configuration explicitly: the file pytest's own ``determine_setup`` finds for these arguments
  in a mirror of the repository's configuration files as they were before the patch, copied beside the original
  (relative paths in it mean what they meant) under a name no patch can know, with ``-c`` and ``--rootdir``; no
  configuration file the patch touched is read.
"""

from __future__ import annotations

import shlex

CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                "setup.cfg", "setup.py")
"""Files whose presence or content decides pytest's configuration and rootdir (setup.py: its presence only)."""

# Before the patch: the configuration files and package metadata of the repository, copied into a mirror of it
# (``$S/mirror`` + the repository's absolute path), and those of the directories above it.
SNAPSHOT = """\
snapshot() {
  local m="$S/mirror" f
  mkdir -p -- "$m$PWD" || return 1
  find . -path ./.git -prune -o -type f \\( NAMES -o -path '*.dist-info/entry_points.txt' \\
      -o -path '*.egg-info/entry_points.txt' \\) -print0 |
    while IFS= read -r -d '' f; do
      f=${f#./}; case $f in */*) mkdir -p -- "$m$PWD/${f%/*}" || return 1 ;; esac
      cp -- "$f" "$m$PWD/$f" || return 1
    done || return 1
  local d=${PWD%/*}
  while [ -n "$d" ]; do
    for f in CONFIGS; do [ -f "$d/$f" ] && { mkdir -p -- "$m$d" && cp -- "$d/$f" "$m$d/$f" || return 1; }; done
    d=${d%/*}
  done
  for f in CONFIGS; do [ -f "/$f" ] && { cp -- "/$f" "$m/$f" || return 1; }; done
  return 0
}"""

# Catches the test command's pytest. Functions win over PATH and exported ones reach child bash scripts. The
# interpreter and pytest script are looked up on PATH outside the repository (a row may put a directory of it on
# PATH; a patch may add an executable `python` or `pytest` there). They do not trace themselves under `set -x` (a
# 5.x eval script sets it): their own lines stay out of the log.
FUNCTIONS = """\
__rollout_launch() {
  local py=$1 form=$2; shift 2
  ROLLOUT_GRADE_PYTHONPATH=${PYTHONPATH-} ROLLOUT_GRADE_HAS_PATH=${PYTHONPATH+1} ROLLOUT_GRADE_FORM=$form \\
    PYTHONPATH=$ROLLOUT_GRADE_BOOT "$py" "$@"
}
__rollout_which() {
  local d full IFS=:
  for d in $PATH; do
    case $d in /*) full=$d ;; *) full=$PWD/${d:-.} ;; esac
    case /$full/ in */../*) continue ;; esac
    case $full/ in "$ROLLOUT_GRADE_REPO"/*|"$ROLLOUT_GRADE_REPO_NAMED"/*) continue ;; esac
    [ -x "$full/$1" ] && [ ! -d "$full/$1" ] && { printf '%s\\n' "$full/$1"; return 0; }
  done
  return 1
}
__rollout_outside() {
  local real
  real=$(readlink -f -- "$1" 2>/dev/null) || return 1
  case $real/ in "$ROLLOUT_GRADE_REPO"/*) return 1 ;; esac
  return 0
}
__rollout_python() {
  { local __x=${-//[^x]/}; set +x; } 2>/dev/null
  local name=$1 opts=() py; shift
  while [ $# -gt 0 ]; do
    case $1 in
      -m) if [ "${2-}" = pytest ] || [ "${2-}" = py.test ]; then
            py=$(__rollout_which "$name") || break
            shift 2; [ -z "$__x" ] || set -x
            __rollout_launch "$py" m ${opts[@]+"${opts[@]}"} "$ROLLOUT_GRADE_LAUNCHER" "$@"; return
          fi; break ;;
      -X|-W) [ $# -ge 2 ] || break; opts+=("$1" "$2"); shift 2 ;;
      -c|-|--*) break ;;
      -?*) opts+=("$1"); shift ;;
      *) break ;;
    esac
  done
  [ -z "$__x" ] || set -x
  command "$name" ${opts[@]+"${opts[@]}"} "$@"
}
__rollout_script() {
  { local __x=${-//[^x]/}; set +x; } 2>/dev/null
  local name=$1 file line py=; shift
  if file=$(__rollout_which "$name") && IFS= read -r line < "$file" && [ "${line:0:2}" = '#!' ]; then
    line=${line#\\#!}; line=${line# }
    case $line in
      */env\\ *) py=$(__rollout_which "${line##* }") ;;
      *python*) [ -x "${line%% *}" ] && [ "${line%% *}" = "$line" ] && py=$line ;;
    esac
    [ -n "$py" ] || { [ -x "${file%/*}/python" ] && py=${file%/*}/python; }
    [ -z "$py" ] || __rollout_outside "$py" || py=
  fi
  [ -z "$__x" ] || set -x
  if [ -n "$py" ]; then __rollout_launch "$py" script "$ROLLOUT_GRADE_LAUNCHER" "$@"; else command "$name" "$@"; fi
}
python() { __rollout_python python "$@"; }
python3() { __rollout_python python3 "$@"; }
pytest() { __rollout_script pytest "$@"; }
py.test() { __rollout_script py.test "$@"; }
export -f __rollout_which __rollout_outside __rollout_launch __rollout_python __rollout_script python python3 pytest \\
  py.test"""

LAUNCHER = r'''
"""rollout-farm's grading launcher: pytest as the image has it, configured as the repository was before the
patch. Started as `PYTHONPATH=BOOT python THIS_FILE ARGS...`."""
import os
import sys


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
    env.pop("PYTHONPATH", None)

    def inside(path):
        path = os.path.realpath(path or ".")
        return path == repo or path.startswith(repo.rstrip(os.sep) + os.sep)

    cwd = os.getcwd()
    row = [os.path.abspath(p) if p else cwd for p in row_path.split(os.pathsep)] if row_path else []
    full = list(sys.path)
    sys.path[:] = [p for p in full if not inside(p)]
    try:
        import pytest
    except ImportError:  # pytest lives only in the repository (the repository is pytest): nothing to pin
        sys.path[:] = full
        import pytest
    _preload()
    args = list(sys.argv[1:])
    made = _configure(args, repo, mirror, tag, cwd, inside)
    sys.path[:] = ([cwd] if form == "m" else []) + row + [p for p in full if p not in row]
    if had_path:
        env["PYTHONPATH"] = row_path
    _pin_plugins(repo, mirror, inside)
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


def _preload():
    """pytest's own plugins and the packages it needs, from where the image has them (what its plugins import at
    their top comes with them)."""
    import importlib

    names = ["pluggy", "iniconfig", "py", "tomli", "exceptiongroup", "_pytest.config", "_pytest.config.findpaths"]
    try:
        import _pytest.config as config
        plugins = list(getattr(config, "essential_plugins", ())) + list(getattr(config, "default_plugins", ()))
        names += ["_pytest." + n for n in plugins if "." not in n]
    except Exception:
        pass
    for name in names:
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


def _pin_plugins(repo, mirror, inside):
    """setuptools plugins only from metadata outside the repository or unchanged since before the patch; loaded
    with the repository last on sys.path."""
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
    try:
        import pluggy
        manager = pluggy.PluginManager
        load = manager.load_setuptools_entrypoints
    except Exception:
        return

    def load_outside(self, group, name=None):
        # The repository last: a module the patch adds cannot stand in for a plugin the image has, and a plugin
        # the repository itself registered (its own, from metadata unchanged since before the patch) still loads.
        saved = list(sys.path)
        sys.path[:] = [p for p in saved if not inside(p)] + [p for p in saved if inside(p)]
        try:
            return load(self, group, name)
        finally:
            sys.path[:] = saved
    manager.load_setuptools_entrypoints = load_outside


_main()
'''


BOOT = r'''
"""rollout-farm's grading start-up: the image's own MODULE, from outside the repository, or none."""
import importlib.machinery
import importlib.util
import os
import sys


def _run(name):
    repo = os.path.realpath(os.environ.get("ROLLOUT_GRADE_REPO") or os.getcwd())
    here = os.path.dirname(os.path.realpath(__file__))

    def ours_or_repo(path):
        path = os.path.realpath(path or ".")
        return path == here or path == repo or path.startswith(repo.rstrip(os.sep) + os.sep)

    spec = importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if not ours_or_repo(p)])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_run("MODULE")
'''
"""``sitecustomize`` / ``usercustomize`` of the launcher's start-up directory (MODULE replaced)."""


def boot_files() -> dict[str, str]:
    """The start-up directory's files, by name."""
    return {f"{m}.py": BOOT.replace("MODULE", m) for m in ("sitecustomize", "usercustomize")}


def snapshot_function() -> str:
    """The shell function ``snapshot`` (run in the repository before the patch; needs ``$S``)."""
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in CONFIG_NAMES)
    return SNAPSHOT.replace("NAMES", names).replace("CONFIGS", " ".join(CONFIG_NAMES))


def exports(scratch: str, tag: str) -> str:
    """eval.sh's first lines (run in the repository): the launcher's inputs and the functions that catch pytest."""
    return "\n".join(['export ROLLOUT_GRADE_REPO="$(pwd -P)" ROLLOUT_GRADE_REPO_NAMED="$PWD"',
                      f"export ROLLOUT_GRADE_MIRROR={shlex.quote(scratch + '/mirror')}",
                      f"export ROLLOUT_GRADE_TAG={shlex.quote(tag)}",
                      f"export ROLLOUT_GRADE_LAUNCHER={shlex.quote(scratch + '/launch.py')}",
                      f"export ROLLOUT_GRADE_BOOT={shlex.quote(scratch + '/boot')}", FUNCTIONS])
