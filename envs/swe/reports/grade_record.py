"""The Grade record: one instance graded, and its report.json in the shape of the harness that grades its row."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rollout.records import Record

SWEBENCH5 = "swebench-5"


class TwinPair(Record):
    """A test and its renamed twin (``envs.swe.grading.twins``), one parameter id, as the run reported them."""

    test: str
    twin: str
    test_status: str | None = None
    """In the log (PASSED, FAILED, ...)."""
    twin_status: str | None = None
    test_report: str | None = None
    """In pytest's junitxml report (passed, failure, error, skipped, xfail; None: not there or no report)."""
    twin_report: str | None = None


class Grade(Record):
    """One instance graded. The first fields are the harness's report.json fields; the rest say how."""

    instance_id: str = ""
    patch_is_None: bool = False
    """No patch at all (the rollout ended without submitting)."""
    patch_exists: bool = False
    """A non-empty patch was submitted."""
    patch_successfully_applied: bool = False
    resolved: bool = False
    """Every FAIL_TO_PASS and PASS_TO_PASS test passes (by the rules of the row's harness)."""
    tests_status: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    """``{FAIL_TO_PASS: {success: [...], failure: [...]}, PASS_TO_PASS: ..., FAIL_TO_FAIL: ..., PASS_TO_FAIL: ...}``;
    empty when the tests did not run (or, for a 5.x row, the log graded nothing)."""
    reward: float = 0.0
    harness: str = "swebench-4"
    """The row's shape, whose harness's rules graded it: swebench-4, swebench-5, swe-smith or swe-gym."""
    apply_method: str | None = None
    """The command of the leniency ladder that applied the patch."""
    apply_output: str = ""
    timed_out: bool = False
    """The tests ran past the evaluation timeout (graded unresolved, as the harness does)."""
    test_cmd: str = ""
    test_returncode: int | None = None
    """The test command's exit code: anything but 0 or 1 (interrupted, crashed, killed) resolves nothing."""
    eval_script_returncode: int | None = None
    """The eval script's own exit code (a 5.x row's script ends with its own commands; ours with the tests')."""
    log_valid: bool | None = None
    """A 5.x row: whether the log is one its harness grades (the markers, a result or the runner's count of tests
    run, an exit code that agrees with the results); None for other rows."""
    infra_failure: bool = False
    infra_failure_reason: str = ""
    """A 5.x row whose log graded nothing: the likely infrastructure cause, as its harness names it (advisory)."""
    unresolved_reason: str = ""
    """Why the patch is not resolved (empty when it is): the grader's own findings first, then failing tests."""
    restored: list[str] = Field(default_factory=list)
    """Files the tests rely on that the patch had changed, put back as at base_commit before the tests ran
    (for tox.ini, setup.cfg, pyproject.toml: their pytest section)."""
    canaries: int = 0
    """Tests of the grader's own added to the run (``envs.swe.grading.canaries``), half of them bound to fail."""
    tampering: list[str] = Field(default_factory=list)
    """What the canaries and twins showed against the run: outcomes forced in the test process (unresolved when
    any)."""
    twins: list[TwinPair] = Field(default_factory=list)
    """The instance's tests run beside renamed, relocated copies of themselves, with both outcomes: one passing where
    the other fails is in ``tampering``."""
    untwinned: dict[str, str] = Field(default_factory=dict)
    """Tests planned a twin that got none (their outcome may honestly depend on their name or place): id -> why."""
    grading_mode: str = ""
    """How pytest ran (``envs.swe.grading.pytest_launch``): ``isolated`` (pytest and what it loads from outside the
    repository, configured as before the patch) or ``harness`` (the repository provides modules pytest loads, or
    the test command runs no pytest through the launcher: the harness's own command, with the checks that still
    apply); "" when the tests did not run."""
    grading_modules: list[str] = Field(default_factory=list)
    """In ``harness`` mode: the repository's own modules that pytest loaded (pytest, pluggy, iniconfig, ...)."""
    log_only: list[str] = Field(default_factory=list)
    """Test ids whose file is in no tree the tests ran in (an inner pytest run's, as pytest's own tests print):
    pytest's report cannot confirm them, so they are read from the log alone, as the harness reads them."""
    report_found: bool | None = None
    """pytest wrote its junitxml report (None: not asked for, or the tests timed out)."""
    test_output: str = ""
    """The raw test log (its tail past the grader's cap)."""
    test_statuses: dict[str, str] = Field(default_factory=dict)
    """Test id → status parsed from the whole log."""
    durations: dict[str, float] = Field(default_factory=dict)
    """Seconds per phase: start, write, apply, reset, tests, overhead, read and cleanup
    (when they happen), close, total."""

    @property
    def completed(self) -> bool:
        """The harness would have written a report.json: a patch applied and the tests finished in time."""
        return self.patch_exists and self.patch_successfully_applied and not self.timed_out

    def report(self) -> dict[str, Any]:
        """The harness's report.json content; a 5.x row's as 5.x writes it (``infra_failure``, a patch counted as
        applied only when its log is graded, the reason when one is named)."""
        fields: dict[str, Any] = {"patch_is_None": self.patch_is_None, "patch_exists": self.patch_exists,
                                  "patch_successfully_applied": self.patch_successfully_applied,
                                  "resolved": self.resolved}
        if self.harness == SWEBENCH5:
            fields["patch_successfully_applied"] = self.patch_successfully_applied and self.log_valid is not False
            fields["infra_failure"] = self.infra_failure
            if self.infra_failure_reason:
                fields["infra_failure_reason"] = self.infra_failure_reason
        if self.tests_status:
            fields["tests_status"] = self.tests_status
        return {self.instance_id: fields}

    def report_json(self) -> dict[str, Any]:
        """What report.json holds: the harness's fields, then the test command's exit code (a 5.x row's: and its
        eval script's) and, when unresolved, the reason (keys the harness's readers ignore)."""
        content = self.report()
        fields = content[self.instance_id]
        fields["test_returncode"] = self.test_returncode
        if self.harness == SWEBENCH5:
            fields["eval_script_returncode"] = self.eval_script_returncode
        if self.unresolved_reason:
            fields["unresolved_reason"] = self.unresolved_reason
        if self.tampering:
            fields["tampering"] = self.tampering
        if self.twins:
            fields["twins"] = [p.model_dump() for p in self.twins]
        if self.grading_mode:
            fields["grading_mode"] = self.grading_mode
        return content
