"""Every task.toml in the repository, read by Harbor 0.25.0's own ``TaskConfig`` (in a venv of its own,
``tests/foreign_venvs.py``): it loads, and it reads the fields the farm honours as the farm reads them."""

from __future__ import annotations

from pathlib import Path

from foreign_venvs import run_function

from envs.harbor.task_config import parse_task_toml

HARBOR = Path(__file__).resolve().parents[3] / "configs" / "harbor"


def harbor_reads(request):
    """In the Harbor venv: each task.toml through ``TaskConfig``; the fields compared, or the error."""
    from harbor.models.task.config import TaskConfig

    out = {}
    for name, text in request.items():
        try:
            config = TaskConfig.model_validate_toml(text)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        env = config.environment
        out[name] = {
            "agent_timeout": config.agent.timeout_sec, "agent_user": config.agent.user,
            "verifier_timeout": config.verifier.timeout_sec,
            "verifier_mode": (config.verifier.environment_mode.value if config.verifier.environment_mode else None),
            "cpus": env.cpus, "memory_mb": env.memory_mb, "workdir": env.workdir, "docker_image": env.docker_image,
            "network_mode": env.network_mode.value if "network_mode" in env.model_fields_set else None,
            "healthcheck": env.healthcheck.command if env.healthcheck else None,
            "steps": [(s.name, s.min_reward, s.agent.timeout_sec) for s in config.steps or []],
            "strategy": config.multi_step_reward_strategy.value if config.multi_step_reward_strategy else None,
        }
    return out


def test_harbor_reads_every_task_toml_of_the_repository_as_we_do(harbor):
    files = sorted(HARBOR.glob("*/*/task.toml"))
    assert len(files) >= 9
    theirs = run_function(harbor, harbor_reads, {str(f.relative_to(HARBOR)): f.read_text() for f in files})
    for name, seen in theirs.items():
        assert "error" not in seen, (name, seen)
        ours = parse_task_toml((HARBOR / name).read_text(), {})
        assert ours.unknown == [], (name, ours.unknown)
        expected = {
            "agent_timeout": ours.agent.timeout_sec, "agent_user": ours.agent.user,
            "verifier_timeout": ours.verifier.timeout_sec,
            "verifier_mode": "separate" if ours.verifier.environment_mode == "separate" else seen["verifier_mode"],
            "cpus": ours.cpus, "memory_mb": ours.memory_mb, "workdir": ours.workdir,
            "docker_image": ours.docker_image,
            "network_mode": ours.network_mode if ours.network_mode_set else None,
            "healthcheck": ours.healthcheck.command if ours.healthcheck else None,
            "steps": [[s.name, s.min_reward, s.agent.timeout_sec] for s in ours.steps],
            "strategy": ours.multi_step_reward_strategy if ours.steps else seen["strategy"],
        }
        assert seen == expected, name
