"""check_runtime: the conformance checker every Runtime must pass (echo, exit codes, timeout, cap, stdin, files,
close)."""

from __future__ import annotations

import hashlib
import inspect
import time
from typing import Any, Callable

from envs.runtimes.output import output_limit
from rollout.errors import RuntimeFailure
from rollout.protocols import ExecResult, Runtime

RuntimeFactory = Callable[[], Any]
"""Returns a fresh, unstarted Runtime (or an awaitable of one)."""


async def check_runtime(
    runtime_factory: RuntimeFactory,
    *,
    executes: bool = True,
    output_cap: int | None = None,
    timeout_budget: float = 10.0,
) -> None:
    """Run the contract against a runtime from ``runtime_factory``; raise ``AssertionError`` at the first violation.

    ``executes=False`` is for runtimes that only pretend (NullRuntime): the checks that need a real
    shell (exit codes, timeout, cap, cwd, env, file visibility to commands) are skipped.
    ``output_cap`` is the runtime's output limit in bytes; by default the one its section declares
    (``runtime.config.max_output_bytes``: ``HasConfig`` and ``CapsOutput``).
    ``timeout_budget`` bounds how long a timed-out ``sleep 30`` (timeout 1 s) may take to come back.
    """
    runtime = runtime_factory()
    if inspect.isawaitable(runtime):
        runtime = await runtime
    _require(isinstance(runtime, Runtime), f"{type(runtime).__name__} does not match the Runtime protocol")
    await runtime.start()
    try:
        if executes:
            await _check_commands(runtime, output_cap, timeout_budget)
        else:
            result = await runtime.exec("echo hello")
            _result_shape(result, "echo hello")
        await _check_files(runtime, executes)
    finally:
        await runtime.close()
    await runtime.close()  # a second close is a no-op, not an error
    try:
        await runtime.exec("echo after close")
    except RuntimeFailure:
        pass
    else:
        raise AssertionError("exec() after close() must raise RuntimeFailure")


async def _check_commands(runtime: Any, output_cap: int | None, timeout_budget: float) -> None:
    result = await runtime.exec("echo hello")
    _result_shape(result, "echo hello")
    _require(result.output == "hello\n", f"echo round trip: expected 'hello\\n', got {result.output!r}")
    _require(result.returncode == 0 and not result.timed_out and not result.truncated, f"echo hello: {result!r}")

    result = await runtime.exec("echo out; echo err >&2; exit 3")
    _require(result.returncode == 3, f"non-zero exit code not preserved: expected 3, got {result.returncode}")
    _require("out" in result.output and "err" in result.output, f"stdout and stderr not combined: {result.output!r}")

    began = time.monotonic()
    result = await runtime.exec("sleep 30", timeout=1)
    elapsed = time.monotonic() - began
    _require(result.timed_out, f"'sleep 30' with timeout=1 not marked timed_out: {result!r}")
    _require(elapsed < timeout_budget, f"'sleep 30' with timeout=1 took {elapsed:.1f}s to come back")
    result = await runtime.exec("echo still here")
    _require(result.output == "still here\n", f"runtime unusable after a timeout: {result!r}")

    cap = output_cap if output_cap is not None else output_limit(runtime)
    _require(cap is not None, "output_cap not given and the runtime declares no max_output_bytes (CapsOutput)")
    result = await runtime.exec("yes", timeout=timeout_budget * 3)
    _require(result.truncated, f"'yes' output not marked truncated (cap {cap} bytes)")
    _require(not result.timed_out, "'yes' ran until its timeout instead of stopping at the output cap")
    _require(len(result.output.encode()) <= cap, f"'yes' returned {len(result.output.encode())} bytes, cap is {cap}")

    result = await runtime.exec(r"printf '\377\376ok'")
    decoded = result.output.endswith("ok") and "\ufffd" in result.output
    _require(decoded, f"undecodable bytes not replaced: {result.output!r}")

    await runtime.exec("mkdir -p check_sub")
    result = await runtime.exec("pwd", cwd="check_sub")
    in_sub = result.output.rstrip("\n").endswith("/check_sub")
    _require(in_sub, f"relative cwd not honoured: pwd printed {result.output!r}")
    result = await runtime.exec("pwd", cwd="/")
    _require(result.output == "/\n", f"absolute cwd not honoured: pwd printed {result.output!r}")

    result = await runtime.exec('echo "$CHECK_VAR"', env={"CHECK_VAR": "a b"})
    _require(result.output == "a b\n", f"env var not passed: got {result.output!r}")
    result = await runtime.exec('echo "${CHECK_VAR-unset}"')
    _require(result.output == "unset\n", f"a per-call env var leaked into the next command: {result.output!r}")
    await _check_stdin(runtime, cap, timeout_budget)


async def _check_stdin(runtime: Any, cap: int, timeout_budget: float) -> None:
    result = await runtime.exec("cat; echo end", timeout=timeout_budget)
    _require(result.output == "end\n" and not result.timed_out, f"without stdin a command must read end of file at "
             f"once: {result!r}")
    data = bytes(range(256)) * 1200  # 307,200 bytes, every byte value
    result = await runtime.exec("wc -c; echo end", stdin=data, timeout=timeout_budget)
    _require(result.output.split() == [str(len(data)), "end"], f"stdin not passed whole: {result.output!r}")
    result = await runtime.exec("md5sum", stdin=data, timeout=timeout_budget)
    _require(result.output.split()[:1] == [hashlib.md5(data).hexdigest()], f"stdin bytes changed: {result.output!r}")
    first = min(cap // 2, 150_000)  # output before reading: needs stdin written while output is read
    result = await runtime.exec(f"head -c {first} /dev/zero | tr '\\0' a; wc -c", stdin=data, timeout=timeout_budget)
    _require(result.output.endswith(f"{len(data)}\n") and result.output.count("a") == first and not result.timed_out,
             f"a command writing before it reads its stdin: {result.output[-200:]!r}")
    result = await runtime.exec("echo ignored", stdin=data * 4, timeout=timeout_budget)
    _require(result.output == "ignored\n" and result.returncode == 0 and not result.timed_out,
             f"a command that never reads its stdin: {result!r}")


async def _check_files(runtime: Any, executes: bool) -> None:
    data = bytes(range(256))
    await runtime.write_file("check_dir/data.bin", data)
    back = await runtime.read_file("check_dir/data.bin")
    _require(back == data, f"write_file/read_file round trip changed the bytes ({len(back)} back of {len(data)})")
    try:
        await runtime.read_file("check_dir/missing.bin")
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("read_file() of a missing file must raise FileNotFoundError")
    if executes:
        result = await runtime.exec("wc -c < check_dir/data.bin")
        _require(result.output.strip() == "256", f"a written file is not visible to commands: {result.output!r}")
        await runtime.exec("printf made > check_dir/made.txt")
        made = await runtime.read_file("check_dir/made.txt")
        _require(made == b"made", f"a file a command wrote reads back as {made!r}")


def _result_shape(result: Any, command: str) -> None:
    _require(isinstance(result, ExecResult), f"exec({command!r}) returned {type(result).__name__}, not ExecResult")
    _require(isinstance(result.output, str) and isinstance(result.returncode, int), f"exec({command!r}): {result!r}")
    _require(result.duration >= 0, f"exec({command!r}) reported a negative duration")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
