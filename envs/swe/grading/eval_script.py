"""The grading script: one bash script that applies the patch, restores the tests, runs them, printing marked steps."""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from envs.swe.diffs import diff_paths
from envs.swe.grading.canaries import CanaryFile, step_script
from envs.swe.grading.patch import reset_script, restore_script, save_script
from envs.swe.grading.protect import section_script
from envs.swe.grading.pytest_launch import boot_files, exports, launcher, snapshot_function
from envs.swe.grading.twins import Twin, step_script as twin_script
from envs.swe.logs.pytest_log import END_MARKER, START_MARKER
from envs.swe.rows.v5 import eval_body, report_export

LOG_CAP = 256 * 1024 * 1024
"""Bytes of test output kept on the runtime's disk (a test printing forever must not fill it)."""
STEP_CAP = 16 * 1024
"""Bytes of a preparation step's output kept (its tail): however verbose the apply ladder is about a big patch,
what the script prints before the tests stays far below any runtime's output cap."""
KILL_GRACE = 2
"""Seconds between an in-container ``timeout``'s SIGTERM and its SIGKILL."""
MARK = ">>>>> rollout-grade"
"""Start of every marker line; a random token follows, so no test output or patch can forge one. The token is
only in the script, which the tests cannot read: it reaches the shell on its standard input, read whole into
the shell's memory before anything runs (never on a command line, in a file or in an environment; the tests'
stdin is /dev/null), and the scratch directory and report are named by other random words."""

_LAST_LINE = "# the end of the grading script"
PRESENT = "present"
"""Start of the line the ``present`` step prints for each test file that is in the tree the tests run in."""

# Runs a step with its output between markers and its exit code in $r. A step that `timeout` stopped (124, or
# 137 once SIGKILL was needed) ends the script: what follows would run on a half-prepared tree.
_STEP = """\
step() {
  local name=$1; shift
  printf '%s begin %s %s\\n' "$P" "$name" "${EPOCHREALTIME:-$SECONDS}"
  if [ "$name" = unpack ]; then "$@"; r=$?; else "$@" 2>&1 | tail -c STEPCAP; r=${PIPESTATUS[0]}; fi
  printf '\\n%s end %s %s %s\\n' "$P" "$name" "$r" "${EPOCHREALTIME:-$SECONDS}"
  case $r in 124|137) exit 0 ;; esac
}"""
# The tests run in the background so their process group is known: `timeout` leads a group of its own, and
# whatever the tests left in it (a server, a worker holding the pipe) is killed once they are over, so `head`
# sees the end of the output. (`timeout` catches SIGINT, so the tests still start with it at its default, not
# ignored as in other background jobs.) The log goes to a file, never through the runtime's output cap; the
# shell's own notes (a "Killed" job, a group already gone) stay out of it. Then pytest's report (when there is
# one) and the log are printed.
_TESTS = """\
printf '%s begin tests %s\\n' "$P" "${EPOCHREALTIME:-$SECONDS}"
set -o pipefail
{ timeout -k GRACE LIMIT bash "$S/eval.sh" "$PWD" 2>&1 KEY& p=$!; wait "$p"; c=$?; kill -9 -- "-$p"
  exit "$c"; } 2>/dev/null | head -c CAP > "$S/log"
r=$?
printf '\\n%s end tests %s %s\\n' "$P" "$r" "${EPOCHREALTIME:-$SECONDS}"
REPORT
printf '%s begin mode %s\\n' "$P" "${EPOCHREALTIME:-$SECONDS}"
head -c 4096 -- "$S/mode" 2>/dev/null
printf '\\n%s end mode %s %s\\n' "$P" "$?" "${EPOCHREALTIME:-$SECONDS}"
printf '%s begin log %s\\n' "$P" "${EPOCHREALTIME:-$SECONDS}"
cat -- "$S/log"
printf '\\n%s end log %s %s\\n' "$P" "$?" "${EPOCHREALTIME:-$SECONDS}"
exit 0"""


@dataclass
class EvalScript:
    """The bash script of one grading, run in the repository. Its steps, each between markers: ``unpack``
    (the patches and helper scripts into a scratch directory outside the repository, unique per grading),
    ``apply1``... (the ladder; ``save`` before the second attempt and ``restore`` before each later one, so
    every attempt starts from the original tree; ``checkout1``... first when there are refs to check out, then
    ``snapshot``: what decides pytest's configuration and plugins, copied before the patch,
    ``envs.swe.grading.pytest_launch``), ``reset`` (the test patch's files and ``reset_paths`` put
    back as at ``base``, the pytest sections of ``section_paths`` restored; when there is any), ``test_patch``
    (when there is one), ``twins`` (``envs.swe.grading.twins``), ``canaries`` (``envs.swe.grading.canaries``; the
    test patch's copy removed), ``tests`` (pytest
    caught and run by the launcher; the log into a file, under ``eval_timeout``; with ``report``, pytest also
    writes a junitxml report to a path no patch can name in advance), ``report`` (that report printed), ``mode``
    (what each launcher run recorded: ``envs.swe.grading.pytest_launch.grading_mode``) and ``log`` (the log
    printed). Each preparation step runs under ``setup_timeout`` and prints at most
    ``STEP_CAP`` bytes (its tail); the script ends early when one fails (an apply attempt: when it was the
    last), and never exits with the tests' code (a runtime may read 124 as its own timeout). ``eval_script``: a 5.x
    row's own script runs as the tests (``envs.swe.rows.v5.eval_body``), the marker prefix on its stdin."""

    token: str
    model_patch: str
    test_patch: str
    base: str
    setup: str
    command: str
    ladder: Sequence[str]
    git: str = "git"
    setup_timeout: float = 600.0
    eval_timeout: float = 1800.0
    reset_paths: Sequence[str] = ()
    section_paths: Sequence[str] = ()
    report: bool = False
    eval_script: str = ""
    checkout: Sequence[str] = ()
    canaries: Sequence[CanaryFile] = ()
    twins: Sequence[Twin] = ()
    test_files: Sequence[str] = ()
    """The files the instance's test ids name: the ``present`` step, after the canaries, prints which are in the
    tree the tests run in."""
    name: str = field(default_factory=lambda: secrets.token_hex(8))
    """Names the scratch directory and the report: random, and not the token."""
    tag: str = field(default_factory=lambda: secrets.token_hex(6))
    """Names the copy of pytest's configuration the launcher writes beside the original."""

    @property
    def prefix(self) -> str:
        return f"{MARK} {self.token}"

    @property
    def scratch(self) -> str:
        return f"/tmp/rollout-grade-{self.name[:8]}"

    @property
    def log_path(self) -> str:
        return f"{self.scratch}/log"

    @property
    def report_path(self) -> str:
        return f"{self.scratch}/{self.name[8:]}.xml"

    @property
    def loader(self) -> str:
        """The command that runs the script given on its stdin (``text()``): read whole into the shell's memory,
        stdin then /dev/null for everything the script starts. The same for every instance and secret-free: all
        that is ever on a command line. A script cut short (no last line) exits 3 before running anything."""
        # `cat`, not `read`: bash reads a pipe a byte at a time. $(...) drops the last newline only.
        body = f's=$(cat); exec 0</dev/null; [[ $s == *{shlex.quote(_LAST_LINE)} ]] || exit 3; eval "$s"'

        return f"bash -c {shlex.quote(body)}"

    @property
    def limit(self) -> float:
        """Seconds the whole script may take: every in-container limit added up, plus slack. A backstop only:
        each step's own ``timeout`` stops it first."""
        # snapshot, save, restore, reset, test patch, twins, canaries, present
        steps = len(self.ladder) + len(self.checkout) + 8
        return self.eval_timeout + steps * (self.setup_timeout + KILL_GRACE) + KILL_GRACE + 30

    def resets(self) -> bool:
        return bool(self.test_patch.strip() or self.reset_paths or self.section_paths)

    def text(self) -> str:
        """The script; the files it unpacks are printed by ``printf`` from quoted strings in it."""
        model_patch = with_newline(self.model_patch)  # a last line without its newline is corrupt to git apply
        touched, backup = diff_paths(model_patch), f"{self.scratch}/saved"
        files = {"model.patch": model_patch, "save.sh": save_script(touched, backup),
                 "restore.sh": restore_script(touched, backup), "eval.sh": self._eval_body(), "launch.py": launcher(),
                 **{f"boot/{name}": text for name, text in boot_files().items()}}
        if self.test_patch.strip():
            files["test.patch"] = with_newline(self.test_patch)
        if self.resets():
            paths = [*diff_paths(files.get("test.patch", "")), *self.reset_paths]
            files["reset.sh"] = (reset_script(list(dict.fromkeys(paths)), self.base, git=self.git) + "\n"
                                 + section_script(self.section_paths, self.base, "$S", git=self.git) + "\n")
        lines = ["# rollout-farm grading: each step's output between markers, the test log last", "exec 2>&1",
                 f"P={shlex.quote(self.prefix)}", f"S={shlex.quote(self.scratch)}",
                 _STEP.replace("STEPCAP", str(STEP_CAP)), snapshot_function(),
                 # The canaries' and twins' names and the test patch (which tells them from the instance's tests)
                 # are gone before the tests start: only this script, in the shell's memory, held them.
                 "twins() {", twin_script(self.twins), "}",
                 "canaries() {", step_script(self.canaries), 'rm -f -- "$S/test.patch"', "}",
                 "unpack() {", 'mkdir -p -- "$S/boot" || return 1']
        for name, content in files.items():
            lines.append(f'printf -- {_printf_format(content)} > "$S/{name}" || return 1')
        lines += ["}", "step unpack unpack", '[ "$r" = 0 ] || exit 0']
        for number, ref in enumerate(self.checkout, 1):
            lines += [f"step checkout{number} {self._timeout()} {self.git} -c advice.detachedHead=false checkout -q "
                      f"{shlex.quote(ref)} --", '[ "$r" = 0 ] || exit 0']
        lines += ["step snapshot snapshot", '[ "$r" = 0 ] || exit 0']
        lines += self._ladder()
        if self.resets():
            lines += [f'step reset {self._timeout()} bash "$S/reset.sh"', '[ "$r" = 0 ] || exit 0']
        if self.test_patch.strip():
            lines += [f'step test_patch {self._timeout()} {self.git} apply --verbose "$S/test.patch"',
                      '[ "$r" = 0 ] || exit 0']
        lines += ["step twins twins",
                  "step canaries canaries", '[ "$r" = 0 ] || exit 0']
        if self.test_files:
            quoted = " ".join(shlex.quote(f) for f in self.test_files)
            lines += [f"present() {{ for f in {quoted}; do [ -e \"$f\" ] && printf '{PRESENT} %s\\n' \"$f\";"
                      " done; true; }", "step present present"]
        report = ""
        if self.report:
            report = ("printf '%s begin report %s\\n' \"$P\" \"${EPOCHREALTIME:-$SECONDS}\"\n"
                      f"cat -- {shlex.quote(self.report_path)} 2>/dev/null\n"
                      "printf '\\n%s end report %s %s\\n' \"$P\" \"$?\" \"${EPOCHREALTIME:-$SECONDS}\"")
        lines.append(_TESTS.replace("GRACE", str(KILL_GRACE)).replace("LIMIT", f"{self.eval_timeout:g}")
                     .replace("CAP", str(LOG_CAP)).replace("REPORT", report)
                     .replace("KEY", '<<<"$P" ' if self.eval_script else ""))
        return "\n".join([*lines, _LAST_LINE]) + "\n"

    def _ladder(self) -> list[str]:
        lines: list[str] = []
        for number, command in enumerate(self.ladder, 1):
            run = f'step apply{number} {self._timeout()} {command.replace("git ", self.git + " ", 1)} "$S/model.patch"'
            if number == 1:  # `git apply` is atomic: only a later attempt can leave half a patch behind
                lines.append(run)
                continue
            undo = "save" if number == 2 else "restore"
            lines += ['if [ "$r" != 0 ]; then', f'  step {undo} {self._timeout()} bash "$S/{undo}.sh"',
                      '  [ "$r" = 0 ] || exit 0', f"  {run}", "fi"]
        return [*lines, '[ "$r" = 0 ] || exit 0']

    def _timeout(self) -> str:
        return f"timeout -k {KILL_GRACE} {self.setup_timeout:g}"

    def _eval_body(self) -> str:
        # Plain bash, as the harness runs its eval script; its START/END markers frame the test output. The
        # report option goes in after the setup lines, so only the test command's pytest writes it.
        report = report_export(self.report_path) + "\n" if self.report else ""
        hardened = exports(self.scratch, self.tag)
        if self.eval_script:
            return f"{hardened}\n{eval_body(self.eval_script, report)}"
        return (f'cd -- "$1" || exit 2\n{hardened}\n{self.setup}\n'
                f'{report}echo {shlex.quote(START_MARKER)}\n{self.command}\n'
                f'rc=$?\necho {shlex.quote(END_MARKER)}\nexit $rc\n')


def _printf_format(content: str) -> str:
    """A quoted ``printf`` format that prints ``content`` byte for byte (a builtin: no process per file, and
    NUL bytes survive, which no shell string holds)."""
    text = content.encode("utf-8", errors="replace").decode("utf-8")
    return shlex.quote(text.replace("\\", "\\\\").replace("%", "%%").replace("\0", "\\000"))


def with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"
