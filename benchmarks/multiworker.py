"""Multi-worker training (MultiWorkerMirroredStrategy) on the reference workload (REF): its overhead, measured on
this host, and what it projects to on separate machines.

REF: War and Peace, Embedding(V, 64) -> LSTM(512) -> Dense(V), global batch 64 x 100 chars, dropout 0, with the
cpu profile's fast LSTM step (``textgen.training.step.build_trainer`` fed by ``textgen.data.distributed_batches``).
Every measurement runs in fresh subprocesses (TensorFlow's thread pools are fixed per process), one phase
after another, each under ``--timeout``:

* 1 worker x 2 threads: one process, the default strategy, ``apply_profile(CPU, threads=2)``, batch 64;
* 1 worker x 2 threads at batch 32: the same with one worker's share of the batch (t_step_32, for the projection);
* 2 workers x 1 thread: two processes on 127.0.0.1 told their place by $TF_CONFIG (free ports), each
  ``apply_profile(CPU, threads=1)`` then ``MultiWorkerMirroredStrategy`` (made before any other TensorFlow
  op), global batch 64 (32 streams per worker); the chief reports global chars/s. Then both time
  ``get_replica_context().all_reduce("SUM", ...)`` inside ``strategy.run`` over tensors shaped like the model's
  trainable variables (what the optimizer's gradient all-reduce moves): ms and MB per all-reduce.

Each timing runs ``--steps`` steps (or all-reduces) after 3 warm-up ones; chars/s = steps x batch x 100 / seconds.

Two processes on one 2-core host share the cores one process already uses: the 2-worker row measures
multi-worker overhead, not a speed-up. The projection to N separate machines, each stepping its 32 streams
alone, is computed from the measured t_step_32 and all-reduce time: N x 3,200 chars / (t_step_32 + t_allreduce).
The all-reduce here runs over loopback; a real network is slower (the payload in MB is printed to scale by).

    python benchmarks/multiworker.py                  # table (--steps 30)
    python benchmarks/multiworker.py --json           # one JSON object
    python benchmarks/multiworker.py --steps 2        # a smoke run

War and Peace (2600-0.txt) is looked up as ``textgen train`` does: in ./corpora and $TEXTGEN_CORPUS_PATH
(e.g. ``TEXTGEN_CORPUS_PATH=../shared/corpora``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import REF, cpu_busy_seconds, cycling, ref_data_config, ref_run_config, reference_splits

WARMUP = 3  # untimed steps (tracing, the pipeline's start, the collectives' set-up) and all-reduces
MB = 10**6
PROJECT_WORKERS = (2, 4, 8)
LINKS_GBPS = (10.0, 1.0)  # network links the projection scales the all-reduce to


# --- measurements, each run in its own process -------------------------------------------


def timed_calls(call: Callable[[], object], calls: int, warmup: int = WARMUP) -> list[float]:
    """Seconds of each of ``calls`` calls of ``call()``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def summary(times: list[float], chars_per_call: int = 0) -> dict:
    seconds = sum(times)
    found = {
        "calls": len(times),
        "seconds": seconds,
        "mean_ms": seconds / len(times) * 1000,
        "median_ms": statistics.median(times) * 1000,
        "min_ms": min(times) * 1000,
    }
    if chars_per_call:
        found["chars_per_sec"] = len(times) * chars_per_call / seconds
    return found


def train_steps(strategy: Any, batch_size: int, steps: int) -> tuple[dict, Any]:
    """REF at global ``batch_size`` under ``strategy``: the timed training steps, and the trainer."""
    import keras

    from textgen.config import replace
    from textgen.data import distributed_batches
    from textgen.device import CPU
    from textgen.layout import StreamLayout
    from textgen.training.step import build_trainer

    corpus, splits = reference_splits()
    data = replace(ref_data_config(str(corpus)), batch_size=batch_size)
    cfg = ref_run_config(str(corpus), splits.vocab.size, CPU, data=data)
    keras.utils.set_random_seed(cfg.training.seed)
    trainer = build_trainer(cfg, strategy)
    layout = StreamLayout.of(len(splits.train), data.batch_size, data.seq_len)
    next_batch = cycling(distributed_batches(strategy, splits.train, layout))
    times = timed_calls(lambda: float(trainer.train_step(*next_batch())), steps)
    return {**summary(times, layout.chars_per_batch), "batch_size": batch_size, "vocab": splits.vocab.size}, trainer


def time_all_reduce(strategy: Any, variables: list[Any], calls: int) -> dict:
    """One replica-context SUM all-reduce of tensors shaped like ``variables``, as the optimizer's."""
    import numpy as np
    import tensorflow as tf

    values = [tf.ones(tuple(v.shape), dtype=v.dtype) for v in variables]

    @tf.function
    def all_reduce() -> tf.Tensor:
        def replica() -> list[tf.Tensor]:
            return tf.distribute.get_replica_context().all_reduce("SUM", [tf.identity(v) for v in values])

        reduced = strategy.experimental_local_results(strategy.run(replica))[0]
        return tf.add_n([tf.reshape(r, [-1])[0] for r in reduced])  # waits for every tensor's all-reduce

    times = timed_calls(lambda: float(all_reduce()), calls)
    floats = sum(int(np.prod(v.shape)) for v in variables)
    return {
        **summary(times),
        "tensors": len(values),
        "floats": floats,
        "mb": sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables) / MB,
    }


def measure_single(batch_size: int, steps: int) -> dict:
    from textgen.device import CPU, apply_profile, import_tensorflow

    import_tensorflow()
    apply_profile(CPU, threads=2)
    import tensorflow as tf

    result, _ = train_steps(tf.distribute.get_strategy(), batch_size, steps)
    return result


def measure_worker(steps: int) -> dict:
    from textgen.cluster import cluster_role, make_strategy
    from textgen.device import CPU, apply_profile, import_tensorflow

    role = cluster_role("multiworker")
    import_tensorflow()
    apply_profile(CPU, threads=1)
    strategy = make_strategy("multiworker", role)  # before any other TensorFlow op (MWMS insists)
    result, trainer = train_steps(strategy, REF["batch_size"], steps)
    result["all_reduce"] = time_all_reduce(strategy, trainer.model.trainable_variables, steps)
    result.update(worker=role.index, chief=role.chief, replicas=strategy.num_replicas_in_sync)
    return result


def _child(args: argparse.Namespace) -> None:
    result = measure_single(args.batch, args.steps) if args.child == "single" else measure_worker(args.steps)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
    print(json.dumps(result), flush=True)


# --- running the phases -------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every process group in ``procs`` still running, and reap them."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen]]:
    """A list to start subprocesses into; whatever is still running when the block ends (normally, on an
    error, Ctrl-C, SIGTERM or SIGHUP) is killed."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        kill(procs)


def last_json(log: Path) -> dict | None:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def run_phase(name: str, commands: list[tuple[list[str], dict[str, str]]], timeout: float, scratch: Path) -> list[dict]:
    """Run ``commands`` (argv, extra environment) together, each in its own session, logging to ``scratch``;
    their results (each's last JSON line) once all exit 0. If one fails or the phase outlives ``timeout``, every
    one still running is killed (a lone worker would wait for its peer forever) and the run stops."""
    busy, wall = cpu_busy_seconds(), time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    logs = [scratch / f"{name}-{i}.log" for i in range(len(commands))]
    failure = None
    with processes() as procs:
        for (argv, env), log in zip(commands, logs, strict=True):
            with open(log, "w") as out:
                procs.append(
                    subprocess.Popen(
                        argv,
                        env={**os.environ, **env},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                failure = f"process {failed[0]} exited with {procs[failed[0]].returncode}"
                break
            if time.monotonic() > deadline:
                failure = f"timed out after {timeout:.0f} s"
                break
            time.sleep(0.1)
        else:
            failed = [i for i, p in enumerate(procs) if p.returncode != 0]
            if failed:
                failure = f"process {failed[0]} exited with {procs[failed[0]].returncode}"
    if failure:
        tails = "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
        raise SystemExit(f"{name}: {failure}; every process of the phase was killed\n{tails}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    elapsed = time.perf_counter() - wall
    other = max(0.0, (cpu_busy_seconds() - busy - ours) / elapsed)
    results = []
    for log in logs:
        result = last_json(log)
        if result is None:
            raise SystemExit(f"{name}: no result in {log}:\n{log.read_text(errors='replace')[-3000:]}")
        results.append({**result, "wall_s": elapsed, "other_cpu_cores": other})
    return results


def child_argv(kind: str, steps: int, batch: int = 0) -> list[str]:
    return [sys.executable, __file__, "--child", kind, "--steps", str(steps), "--batch", str(batch)]


def measure_all(args: argparse.Namespace, scratch: Path) -> dict:
    steps, timeout = args.steps, args.timeout
    single = run_phase("single64", [(child_argv("single", steps, REF["batch_size"]), {})], timeout, scratch)[0]
    half = REF["batch_size"] // 2
    single32 = run_phase("single32", [(child_argv("single", steps, half), {})], timeout, scratch)[0]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    commands = [
        (
            child_argv("worker", steps),
            {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})},
        )
        for i in range(2)
    ]
    workers = run_phase("workers", commands, timeout, scratch)
    return {"single": single, "single32": single32, "workers": workers}


# --- the report ---------------------------------------------------------------------------


def projection(t_step_32: float, t_allreduce: float, mb: float) -> list[dict]:
    """Throughput on N separate machines each stepping 32 streams alone, under the loopback all-reduce time and
    under bandwidth floors: a ring all-reduce moves 2(N-1)/N of the payload through each worker's link."""
    chars = REF["batch_size"] // 2 * REF["seq_len"]
    rows = []
    for n in PROJECT_WORKERS:
        cases = {"loopback": t_allreduce}
        for gbps in LINKS_GBPS:
            cases[f"{gbps:g} Gb/s"] = max(t_allreduce, 2 * (n - 1) / n * mb * 8 / (gbps * 1000))
        rows.append(
            {
                "workers": n,
                **{
                    name: {
                        "allreduce_ms": t * 1000,
                        "chars_per_sec": n * chars / (t_step_32 + t),
                        "efficiency": t_step_32 / (t_step_32 + t),
                    }
                    for name, t in cases.items()
                },
            }
        )
    return rows


def build_report(measured: dict, args: argparse.Namespace, load_before: float, started: float) -> dict:
    single, single32, workers = measured["single"], measured["single32"], measured["workers"]
    chief = next(w for w in workers if w["chief"])
    ar = chief["all_reduce"]
    t32, t_ar = single32["mean_ms"] / 1000, ar["mean_ms"] / 1000
    base = single["chars_per_sec"]
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "steps": args.steps,
        "warmup": WARMUP,
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "seconds": time.perf_counter() - started,
        "rows": [
            {"config": "1 worker, batch 64 (REF)", "threads": 2, **single, "ratio": 1.0},
            {
                "config": "2 workers on this host, 32 + 32",
                "threads": 1,
                **{k: v for k, v in chief.items() if k != "all_reduce"},
                "ratio": chief["chars_per_sec"] / base,
            },
            {
                "config": "1 worker, batch 32 (t_step_32)",
                "threads": 2,
                **single32,
                "ratio": single32["chars_per_sec"] / base,
            },
        ],
        "all_reduce": {"chief": ar, "other_worker": [w["all_reduce"] for w in workers if not w["chief"]]},
        "all_reduce_of_step_64": t_ar / (single["mean_ms"] / 1000),
        "all_reduce_share_of_step_32": t_ar / (t32 + t_ar),
        "projection": projection(t32, t_ar, ar["mb"]),
    }


def print_table(report: dict) -> None:
    rows, ar = report["rows"], report["all_reduce"]["chief"]
    print(
        f"textgen multi-worker ({report['date']}, {report['cores']} cores, load {report['load_avg_1m_before']:.2f} -> "
        f"{report['load_avg_1m_after']:.2f}; REF 1 x {REF['units']}, global batch {REF['batch_size']} x "
        f"{REF['seq_len']}, fast LSTM; {report['steps']} steps after {report['warmup']} warm-up each)"
    )
    header = f"{'config':<34} {'threads/worker':>14} {'step ms':>8} {'median':>7} {'chars/s':>9} {'ratio':>6} {'peak RSS MB':>12} {'other CPU':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['config']:<34} {r['threads']:>14} {r['mean_ms']:>8.1f} {r['median_ms']:>7.1f} "
            f"{r['chars_per_sec']:>9,.0f} {r['ratio']:>5.2f}x {r['peak_rss_mb']:>12,.0f} {r['other_cpu_cores']:>10.2f}"
        )
    print(
        "The 2-worker row is two processes sharing this host's cores with 1 thread each: it measures the "
        "multi-worker overhead, not a speed-up."
    )
    print(
        f"all-reduce of the gradients ({ar['tensors']} tensors, {ar['floats']:,} floats, {ar['mb']:.2f} MB) over "
        f"127.0.0.1 between the 2 workers: {ar['mean_ms']:.1f} ms mean, {ar['median_ms']:.1f} ms median, "
        f"{ar['min_ms']:.1f} ms min ({ar['calls']} calls); {report['all_reduce_of_step_64']:.0%} of the 1-worker "
        f"batch-64 step, {report['all_reduce_share_of_step_32']:.0%} of a batch-32 step + all-reduce"
    )
    t32 = rows[2]["mean_ms"]
    chars = REF["batch_size"] // 2 * REF["seq_len"]
    print(
        f"Projection, N separate machines like this one, each stepping its {REF['batch_size'] // 2} streams alone "
        f"(global batch N x {REF['batch_size'] // 2}): throughput ~ N x {chars:,} chars / (t_step_32 + t_allreduce), "
        f"efficiency = t_step_32 / (t_step_32 + t_allreduce), with t_step_32 = {t32:.1f} ms measured and t_allreduce "
        f"the loopback mean, or the time the payload takes on a link if longer (a ring all-reduce moves 2(N-1)/N x "
        f"{ar['mb']:.2f} MB through each worker's link; latency per ring step not included). A real network "
        f"differs from loopback: scale t_allreduce by bandwidth."
    )
    cases = [k for k in report["projection"][0] if k != "workers"]
    print(f"{'N':>3} " + " ".join(f"{c + ': ms, chars/s, eff':>34}" for c in cases))
    for p in report["projection"]:
        cells = [
            f"{p[c]['allreduce_ms']:>8.1f} {p[c]['chars_per_sec']:>10,.0f} {p[c]['efficiency']:>6.0%}".rjust(34)
            for c in cases
        ]
        print(f"{p['workers']:>3} " + " ".join(cells))
    print(
        f"(against 1 worker x 2 threads at batch 64 here: {rows[0]['chars_per_sec']:,.0f} chars/s; "
        f"{report['seconds']:.0f} s in all)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (and all-reduces) after 3 warm-up ones")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each phase may take before it is killed")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    if args.steps < 1:
        parser.error("--steps must be at least 1")

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the phase, which kills its processes

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    load_before, started = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="textgen-multiworker-") as scratch:
        measured = measure_all(args, Path(scratch))
    report = build_report(measured, args, load_before, started)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
