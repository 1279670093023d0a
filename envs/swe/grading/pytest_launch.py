"""pytest on the base commit's terms: the shell functions that catch the test command's pytest, the snapshot of
what pytest reads that is taken before the patch, and the launcher that runs pytest from them.

A patch may add or change any file of the repository, and ``python -m pytest`` from the repository root puts it
first on ``sys.path``. So when the test command runs pytest (``pytest``, ``py.test``, ``python[3] -m pytest``, with
interpreter options), it runs through the launcher (``envs/swe/grading/pytest_launcher.py``) instead, which (for
``python[3] -m unittest``: the first two points, with the standard library's runner in place of pytest):

- starts the interpreter with the row's ``PYTHONPATH`` held back and only a directory of ours on it, whose
  ``sitecustomize`` / ``usercustomize`` run the image's own from outside the repository (no start-up file a patch
  wrote runs, whatever path the row adds or an editable install's ``.pth`` puts on ``sys.path``; and no ``-S``,
  which multiprocessing would pass on to its children);
- puts ``sys.path`` as the command would have had it (the working directory first for ``-m``, the row's
  ``PYTHONPATH``) and imports pytest, its own plugins and what they need with a finder first on the meta path
  (``BaseOnly``) that takes a top-level module from outside the repository when the repository did not have it
  before the patch (the snapshot lists the repository's module files): a module the patch adds cannot stand in
  for them, and a module the repository had is the copy the harness's command imports, even when the repository
  is pytest, pluggy or another package pytest loads (the code under test is always the repository's). Such a
  module is neither preloaded nor wrapped, and when it is pytest's own, its configuration is not pinned; each run
  appends its mode (``isolated`` or ``harness`` and those modules) to a file the grade reads (``grading_mode``);
- loads setuptools plugins (``pytest11`` entry points) only from package metadata that is outside the repository,
  or inside it byte for byte as before the patch, their modules through the same finder;
- gives pytest its configuration explicitly: the file pytest's own ``determine_setup`` finds for these arguments
  in a mirror of the repository's configuration files as they were before the patch, copied beside the original
  (relative paths in it mean what they meant) under a name no patch can know, with ``-c`` and ``--rootdir``; no
  configuration file the patch touched is read.
"""

from __future__ import annotations

import shlex
from pathlib import Path

CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
                "setup.cfg", "setup.py")
"""Files whose presence or content decides pytest's configuration and rootdir (setup.py: its presence only)."""

# Before the patch: the configuration files and package metadata of the repository, copied into a mirror of it
# (``$S/mirror`` + the repository's absolute path), and those of the directories above it; and the list of the
# repository's module files and directories (``$S/modules``), by which the launcher tells the repository's own
# modules from those the patch adds.
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
  local top
  top=$(pwd -P) || return 1
  find "$top" -path "$top/.git" -prune -o \\( -type d -o -name '*.py' -o -name '*.pyc' -o -name '*.so' \\
      -o -name '*.pyd' \\) -print > "$S/modules" || return 1
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
          elif [ "${2-}" = unittest ]; then
            py=$(__rollout_which "$name") || break
            shift 2; [ -z "$__x" ] || set -x
            ROLLOUT_GRADE_RUNNER=unittest __rollout_launch "$py" m ${opts[@]+"${opts[@]}"} "$ROLLOUT_GRADE_LAUNCHER" \\
              "$@"; return
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

LAUNCHER_FILE = Path(__file__).with_name("pytest_launcher.py")
"""The launcher (``envs/swe/grading/pytest_launcher.py``), copied into the grading runtime as text and run there."""


def launcher() -> str:
    """The launcher's source."""
    return LAUNCHER_FILE.read_text(encoding="utf-8")




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
                      f"export ROLLOUT_GRADE_BOOT={shlex.quote(scratch + '/boot')}",
                      f"export ROLLOUT_GRADE_BASE={shlex.quote(scratch + '/modules')}",
                      f"export ROLLOUT_GRADE_MODE_FILE={shlex.quote(mode_path(scratch))}", FUNCTIONS])


def mode_path(scratch: str) -> str:
    """Where each launcher run appends its mode (``isolated``, or ``harness`` and the modules the repository
    provides that pytest loads)."""
    return scratch + "/mode"


def grading_mode(text: str) -> tuple[str, list[str]]:
    """The mode of a grading from what its launcher runs recorded: ``isolated`` when every pytest run was,
    ``harness`` (with the repository's modules) when any was not or none ran through the launcher."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if lines and all(words == ["isolated"] for words in lines):
        return "isolated", []
    modules = sorted({m for words in lines if words[0] == "harness" for m in words[1:]})
    return "harness", modules
