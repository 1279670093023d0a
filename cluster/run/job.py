"""A run job: config → validated parts → run directory → resumable execution → summary.

``prepare`` does every check that can fail (config, dataset, components, runtime permissions, model
reachability, stored run) before any rollout starts; ``execute`` runs what the plan says is left.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TextIO

from cluster.assembly import FarmAssembly, preflight
from cluster.assembly.backend_choice import ray_available, run_settings
from cluster.assembly.startup import FIRST_CALL, StartupClock, resolve_images
from cluster.backends.seam import Backend
from cluster.backends.sources import ConfigSource
from cluster.compose import Composer
from cluster.config.dataset import load_dataset
from cluster.config.run_config import RunConfig
from cluster.config.run_dir import resolve_run_dir
from cluster.run.driver import Driver
from cluster.run.host_checks import reap_leftovers, resolve_auto_runtimes
from cluster.run.swe_outputs import model_name, write_swe_outputs
from cluster.web.live_page import LivePageSettings, open_for_run
from cluster.web.report_files import write_for_run
from cluster.web.report_png import warm
from envs.runtimes.warm_pool import close_all
from rollout.config.load import load_config, validate
from rollout.data.dataset import row_hash
from rollout.formats.export import AgentNames, atif_writer
from rollout.records import Task
from rollout.store import live
from rollout.store.manifest import build_manifest
from rollout.store.resume import Plan
from rollout.store.run_dir import RunStore
from rollout.store.summary import format_table, summarize


@dataclass
class Job:
    config: RunConfig
    raw: dict[str, Any]
    run_id: str
    run_dir: Path
    dataset_path: Path
    tasks: list[Task]
    composer: Composer
    store: RunStore
    plan: Plan
    out: TextIO = field(default=sys.stderr)
    clock: StartupClock = field(default_factory=StartupClock)
    """The start-up's parts, from the job's start to the first model call (the summary's ``startup``)."""
    assembly: FarmAssembly | None = None
    """The run's assembly (cluster session, model, backend), built when it executes."""
    web: LivePageSettings | None = None
    """The live page to serve while the run goes (``rollout run --web``); None: none."""

    @property
    def owns_cluster(self) -> bool:
        """The job started its Ray cluster (embedded, local): it stops it once the rollouts are done."""
        return self.assembly is not None and self.assembly.owns_cluster


def prepare(
    paths: list[str],
    overrides: list[str] = (),
    *,
    new_run: bool = False,
    retry_infra: bool = False,
    out: TextIO = sys.stderr,
) -> Job:
    clock = StartupClock()
    clock.begin("config")
    raw = load_config(paths, list(overrides))
    notes = resolve_auto_runtimes(raw)
    config = validate(RunConfig, raw)
    preflight.check_serve(config)
    if raw.get("fake_server") is not None:
        notes.append("fake_server: read as serve: {app: scripted, in_process: true, ...}, its one spelling now")
    if config.played_here is not None and not config.played_here.in_process:
        notes.append(f"serve: the scripted policy {config.serve.policy!r} plays in this process (farm.backend=local "
                     "starts no Ray; farm.backend=ray deploys it as a Serve application)")
    if config.farm.backend == "ray":
        ray_available()  # before any work: a missing extra is a config problem, named as such
    run_id = config.run_id or Path(paths[0]).stem
    composer = Composer(config)
    if composer.gateways:
        notes.append("gateway: the agent's model calls go through the run's own gateway in each worker, a key per "
                     "rollout; each sandbox reaches it through a socket bound into it and keeps no network")
    clock.end("config")
    clock.begin("dataset")
    dataset_path, tasks, loaded = load_dataset(config, paths[0], composer.row_check())
    notes.extend(loaded)
    composer.bind_tasks(tasks)
    preflight.check(config, composer, tasks)  # before the run directory: a run that cannot work writes nothing
    run_dir = resolve_run_dir(config, run_id, list(overrides))
    resolved = config.model_dump(mode="json")
    resolved["dataset"]["path"] = str(dataset_path)
    seeds = {"base": config.run.seed, "per_sample": "base + sample_index"}
    store = RunStore(run_dir, keep_results=False)  # a long run's results are on disk, not in memory
    rows = {t.task_id: row_hash(t) for t in tasks}
    store.open(resolved, build_manifest(resolved, dataset_path, seeds, rows), new_run=new_run,
               upgrade=RunConfig.upgrade)
    plan = store.plan(tasks, config.run.samples, config.run.max_attempts, retry_infra)
    damaged = store.describe_bad_lines()
    for note in notes + ([damaged] if damaged else []):
        print(note, file=out, flush=True)
    clock.end("dataset")
    return Job(config, raw, run_id, run_dir, dataset_path, tasks, composer, store, plan, out, clock)


async def execute(job: Job) -> dict[str, Any]:
    """Run what is left of the job; write and return summary.json's content."""
    say = lambda text: print(text, file=job.out, flush=True)  # noqa: E731
    say(f"run directory: {job.run_dir}")
    say(f"plan: {job.plan.describe()}")
    page = open_for_run(job.web, job.run_dir, say)
    try:
        return await _execute(job, say)
    finally:
        if page is not None:
            page.stop()


def open_farm(job: Job, assembly: FarmAssembly) -> Awaitable[Backend]:
    """The run's farm opened: while the cluster starts, containers a dead earlier attempt left are reaped and (when
    the workers run on this machine) the first rollouts' images resolved, so the workers find them."""
    beside = [lambda: reap_leftovers(job.run_id, job.composer.container_engines(), job.out)]
    if assembly.workers_here:
        first = [task for task, _, _ in job.plan.todo[:job.config.run.concurrency]]
        beside.append(lambda: job.clock.call("images", resolve_images, job.composer, first))
    settings = run_settings(job.config, job.composer, run_id=job.run_id, run_dir=str(job.run_dir))
    return assembly.open(ConfigSource(job.composer), settings, clock=job.clock, beside=beside)


async def _execute(job: Job, say: Callable[[str], None]) -> dict[str, Any]:
    driver: Driver | None = None
    t0 = time.perf_counter()
    assembly = job.assembly = FarmAssembly.for_run(job.config, dataset=str(job.dataset_path), out=job.out)
    try:
        if job.plan.todo:
            backend = await open_farm(job, assembly)
            driver = Driver(
                backend, job.store, job.plan,
                run_id=job.run_id, concurrency=job.config.run.concurrency, base_seed=job.config.run.seed,
                progress_interval=job.config.run.progress_interval,
                write_trajectories=job.config.output.trajectories, out=job.out,
                on_result=(atif_writer(job.store, AgentNames.of_run(job.run_dir, job.tasks), say)
                           if job.config.output.trajectory_format == "atif" else None),
                keep_results=False,  # every result is on disk; the summary reads results.jsonl
            )
            job.clock.begin(FIRST_CALL)
            threading.Thread(target=warm, name="report-imports", daemon=True).start()  # while the run waits on I/O
            try:
                await driver.run()
            finally:  # the workers and the model's app go down side by side; Serve is told, not waited for
                await assembly.close(wait=False)
        else:
            reap_leftovers(job.run_id, job.composer.container_engines(), job.out)
            say(f"nothing to do: all {job.plan.done_count + job.plan.final_failed_count} rollouts were already done")
            mark_live_finished(job.run_dir)
    finally:
        await close_all()
        await assembly.close()
        job.store.close_results()
    releasing = asyncio.ensure_future(assembly.release())  # the cluster down while the outputs are written
    wall = time.perf_counter() - t0
    latest = job.store.latest_results()  # read once from results.jsonl: the summary's and the SWE outputs'
    summary = summarize(latest, k_values=_k_values(job.config.run.samples),
                        wall_seconds=wall, ran=driver.ran if driver else 0,
                        startup=job.clock.split(driver.first_call if driver else None))
    summary["run_id"] = job.run_id
    summary["run_dir"] = str(job.run_dir)
    if driver is not None and driver.ran:
        summary["concurrency"] = {"asked": job.config.run.concurrency, "reached": driver.reached}
    limits = assembly.backend.node_limits() if assembly.backend is not None else None
    if limits:  # farm.adaptive: where each node's limit ended, and every change with why
        summary["adaptive"] = limits
    kept = assembly.backend.kept_workers if assembly.backend is not None else None
    if kept is not None:  # a standing cluster's workers kept between runs: how many this run took from an earlier one
        summary["kept_workers"] = kept
        if summary.get("startup"):
            summary["startup"]["workers_reused"] = f"{kept['reused']}/{kept['reused'] + kept['started']}"
    if assembly.model_outages:  # replicas lost during the run (a model node died) and how long until all ran again
        summary["model_tier"] = assembly.model_outages
    lost = assembly.backend.lost_nodes() if assembly.backend is not None else {}
    summary["nodes_lost"], summary["nodes_lost_why"] = sorted(lost), lost
    summary["transfers"] = assembly.backend.transfers if assembly.backend is not None else None
    swe = write_swe_outputs(job.store, job.run_id, model_name(job.raw), latest)
    del latest
    if swe is not None:
        summary["swe"] = {k: swe[k] for k in ("total_instances", "submitted_instances", "completed_instances",
                                              "resolved_instances", "unresolved_instances", "empty_patch_instances",
                                              "error_instances") if k in swe}
    await asyncio.to_thread(write_for_run, job.run_dir, summary, say)  # beside the cluster's release
    job.store.write_summary(summary)
    job.store.close()  # the run's last write: another run may take the directory now
    print(format_table(summary), flush=True)  # the result goes to stdout; progress went to stderr
    say(f"run directory: {job.run_dir}")
    await releasing
    return summary


def mark_live_finished(run_dir: Path) -> None:
    """A live.json left by a killed earlier session says the run is over once nothing is left to do."""
    try:
        doc = live.read_live(run_dir)
    except (FileNotFoundError, ValueError):
        return
    if doc.get("state") != live.FINISHED:
        doc.update(state=live.FINISHED, in_flight=[], updated_at=time.time())
        live.write_live(run_dir, doc)


def _k_values(samples: int) -> tuple[int, ...]:
    return tuple(sorted({1, samples})) if samples > 1 else (1,)
