"""How textgen scales with the corpus: encoding, warm start, the input pipeline against the step, memory.

Builds many-file corpora of about 10 MB and 100 MB from the shared Project Gutenberg books (copies of
them, smallest first, repeated as often as needed, named ``copy{i}-{book}``, like a user's library)
in a scratch directory, never in the repo, and measures on each, every measurement in a fresh
subprocess so that RSS and TensorFlow's thread pools start clean:

* encoding, cold: ``load_splits`` into an empty id cache, in MB of corpus per second (the books
  were just written, so they are read from the page cache: this is the encoder's speed, not the disk's);
* warm start: the time from the start of the work to the first training batch, the id cache warm:
  the corpus's files found, fingerprinted and their encodings detected (as ``textgen train DIR``
  does), ``load_splits``, the ``distributed_batches`` pipeline built and its first batch read.
  ``import tensorflow`` is timed apart;
* the tf.data pipeline alone (REF layout 64 x 100, cpu profile) in batches/s, against the batches/s
  the REF training step consumes (``build_trainer``, cpu profile, after 2 warm-up steps), and their ratio;
* peak RSS (``ru_maxrss``) of a process training REF (1 x 512, batch 64 x 100) for ``--batches`` batches.

MB are 10^6 bytes throughout. Targets: encoding >= 50 MB/s; warm start <= 5 s; peak RSS on the
largest corpus <= 1,200 MB and within 150 MB of the smallest's (memory set by the model and the
batch, not the corpus).

    python benchmarks/scale.py                        # 10 MB and 100 MB, table
    python benchmarks/scale.py --json                 # one JSON object
    python benchmarks/scale.py --quick --batches 3    # 1 MB and 5 MB, short: a smoke run
    python benchmarks/scale.py --sizes 10,100,300 --books ~/books --scratch /data/textgen-scale

Corpora are kept in ``--scratch`` (default /tmp/textgen-scale) and reused while they match; each
size's id cache there is emptied before its cold encoding.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common import REF, cpu_busy_seconds, cycling, ref_data_config, ref_run_config, timed

if TYPE_CHECKING:
    from textgen.config import DataConfig

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BOOKS = REPO.parent / "shared" / "corpora" / "gutenberg"
DEFAULT_SCRATCH = Path("/tmp/textgen-scale")
MARKER = ".textgen-scale"  # in every directory this benchmark made, and may empty
MB = 10**6

ENCODE_MB_PER_S = 50.0
WARM_START_S = 5.0
PEAK_RSS_MB = 1200.0
RSS_SPREAD_MB = 150.0


# --- corpora -------------------------------------------------------------------------------------


def corpus_plan(books: list[Path], target: int) -> list[tuple[str, Path]]:
    """(file name, book) pairs adding up to at least ``target`` bytes: the books smallest first, over and over."""
    copies = ((f"copy{i}-{book.name}", book) for i in itertools.count() for book in books)
    plan: list[tuple[str, Path]] = []
    total = 0
    while total < target:
        name, book = next(copies)
        plan.append((name, book))
        total += book.stat().st_size
    return plan


def made_here(directory: Path) -> bool:
    """Whether ``directory`` may be emptied: this benchmark made it, or it holds nothing."""
    return (directory / MARKER).is_file() or not any(directory.iterdir())


def fresh_dir(directory: Path) -> Path:
    """``directory``, emptied (only if this benchmark made it) and marked as this benchmark's."""
    if directory.exists():
        if not made_here(directory):
            raise SystemExit(f"{directory} holds files this benchmark did not make; give another --scratch")
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / MARKER).touch()
    return directory


def build_corpus(books_dir: Path, size_mb: float, directory: Path) -> dict:
    """A corpus of about ``size_mb`` MB in ``directory``, kept if it is already the one planned."""
    found = (p for p in books_dir.glob("*.txt") if p.is_file() and p.stat().st_size)
    books = sorted(found, key=lambda p: (p.stat().st_size, p.name))
    if not books:
        raise SystemExit(f"no non-empty *.txt books in {books_dir}; give --books")
    plan = corpus_plan(books, int(size_mb * MB))
    wanted = {name: book.stat().st_size for name, book in plan}
    present = {p.name: p.stat().st_size for p in directory.glob("*.txt")} if directory.is_dir() else {}
    reused = present == wanted and (directory / MARKER).is_file()
    if not reused:
        fresh_dir(directory)
        for name, book in plan:
            shutil.copyfile(book, directory / name)
    return {"directory": str(directory), "files": len(plan), "bytes": sum(wanted.values()), "reused": reused}


# --- measurements, each run in its own process ------------------------------------------------


def corpus_config(directory: Path) -> DataConfig:
    """REF's DataConfig for the corpus in ``directory`` as ``textgen train DIR`` builds it: its *.txt files
    in order, their encoding detected."""
    from textgen.corpus import resolve_corpora, resolve_encoding

    files = resolve_corpora([str(directory)])
    codecs = {resolve_encoding(f, "auto") for f in files}
    return ref_data_config(str(directory), tuple(str(f) for f in files), codecs.pop() if len(codecs) == 1 else "auto")


def measure_encode(corpus: Path, cache: Path) -> dict:
    """``load_splits`` into the empty id cache ``cache``."""
    from textgen.data import load_splits

    cfg = corpus_config(corpus)
    if any(p.name != MARKER for p in cache.iterdir()):
        raise SystemExit(f"the id cache {cache} is not empty: the encoding would not be cold")
    started = time.perf_counter()
    splits = load_splits(cfg, cache)
    seconds = time.perf_counter() - started
    size = sum(Path(f).stat().st_size for f in cfg.paths)
    return {
        "seconds": seconds,
        "mb_per_sec": size / MB / seconds,
        "documents": splits.encoded.documents,
        "chars": splits.encoded.chars,
        "vocab": splits.vocab.size,
        "train_ids": len(splits.train),
        "id_bytes": sum((splits.encoded.path / f"{n}.ids").stat().st_size for n in ("train", "val", "test")),
    }


def measure_start(corpus: Path, cache: Path) -> dict:
    """Work to the first training batch from the warm id cache, ``import tensorflow`` timed apart."""
    started = time.perf_counter()
    from textgen.device import CPU, apply_profile, import_tensorflow

    import_tensorflow()
    import tensorflow as tf

    apply_profile(CPU)
    imported = time.perf_counter()
    from textgen.corpus import corpus_fingerprint
    from textgen.data import corpus_source, distributed_batches, load_splits
    from textgen.layout import StreamLayout

    cfg = corpus_config(corpus)
    corpus_fingerprint([Path(f) for f in cfg.paths])  # textgen train keeps it in the run's config
    found = time.perf_counter()
    warm = (cache / corpus_source(cfg).key() / "meta.json").is_file()
    splits = load_splits(cfg, cache)
    loaded = time.perf_counter()
    layout = StreamLayout.of(len(splits.train), cfg.batch_size, cfg.seq_len)
    x, _ = next(iter(distributed_batches(tf.distribute.get_strategy(), splits.train, layout)))
    first = time.perf_counter()
    if not warm:
        raise SystemExit(f"the id cache {cache} had no entry for the corpus: the start would not be warm")
    if tuple(x.shape) != (cfg.batch_size, cfg.seq_len):
        raise SystemExit(f"the first batch is {tuple(x.shape)}, not {cfg.batch_size} x {cfg.seq_len}")
    return {
        "import_tf_s": imported - started,
        "seconds": first - imported,
        "files_s": found - imported,  # found, encodings detected, fingerprinted
        "load_splits_s": loaded - found,
        "first_batch_s": first - loaded,  # the pipeline built and its first batch read
    }


def measure_pipeline(corpus: Path, cache: Path, seconds: float) -> dict:
    """The tf.data pipeline alone: batches/s it makes, its iterator already built."""
    from textgen.device import CPU, apply_profile, import_tensorflow

    import_tensorflow()
    apply_profile(CPU)
    import tensorflow as tf

    from textgen.data import distributed_batches, load_splits
    from textgen.layout import StreamLayout

    cfg = corpus_config(corpus)
    splits = load_splits(cfg, cache)
    layout = StreamLayout.of(len(splits.train), cfg.batch_size, cfg.seq_len)
    next_batch = cycling(distributed_batches(tf.distribute.get_strategy(), splits.train, layout))
    batches, elapsed = timed(next_batch, seconds, warmup=1)
    return {"batches_per_sec": batches / elapsed, "batches": batches, "epoch_batches": layout.batches}


def measure_train(corpus: Path, cache: Path, batches: int) -> dict:
    """REF trained for ``batches`` batches: the step's batches/s after 2 warm-up steps, and peak RSS."""
    from textgen.device import CPU, apply_profile, import_tensorflow

    import_tensorflow()
    apply_profile(CPU)
    import keras

    from textgen.data import distributed_batches, load_splits
    from textgen.layout import StreamLayout
    from textgen.training.step import build_trainer

    cfg = corpus_config(corpus)
    splits = load_splits(cfg, cache)
    run_cfg = ref_run_config(cfg.corpus, splits.vocab.size, CPU, data=cfg)
    keras.utils.set_random_seed(run_cfg.training.seed)
    trainer = build_trainer(run_cfg)
    setup_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
    layout = StreamLayout.of(len(splits.train), cfg.batch_size, cfg.seq_len)
    next_batch = cycling(distributed_batches(trainer.strategy, splits.train, layout))
    loss, started = 0.0, 0.0
    for step in range(batches):
        if step == 2:  # warm-up done (the step's tracing, the pipeline's start)
            started = time.perf_counter()
        loss = float(trainer.train_step(*next_batch()))
    elapsed = time.perf_counter() - started
    return {
        "step_batches_per_sec": (batches - 2) / elapsed,
        "chars_per_sec": (batches - 2) * layout.chars_per_batch / elapsed,
        "batches": batches,
        "final_loss": loss,
        "setup_rss_mb": setup_rss,  # peak after loading the splits and building the trainer
    }


def _child(args: argparse.Namespace) -> None:
    launch = time.time() - args.spawned  # interpreter start and this module's imports
    corpus, cache = Path(args.corpus), Path(args.cache)
    if args.child == "encode":
        result = measure_encode(corpus, cache)
    elif args.child == "start":
        result = measure_start(corpus, cache)
        result["launch_s"] = launch
    elif args.child == "pipeline":
        result = measure_pipeline(corpus, cache, args.seconds)
    else:
        result = measure_train(corpus, cache, args.batches)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
    print(json.dumps(result))


def _run_child(kind: str, corpus: Path, cache: Path, args: argparse.Namespace) -> dict:
    """Run one measurement in a fresh subprocess; add the CPU other processes used meanwhile."""
    busy, wall = cpu_busy_seconds(), time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, __file__, "--child", kind, "--corpus", str(corpus), "--cache", str(cache)]
    command += ["--seconds", str(args.seconds), "--batches", str(args.batches), "--spawned", repr(time.time())]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} measurement on {corpus} failed:\n{out.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    elapsed = time.perf_counter() - wall
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = elapsed
    result["other_cpu_cores"] = max(0.0, (cpu_busy_seconds() - busy - ours) / elapsed)
    return result


# --- the report ---------------------------------------------------------------------------------


def measure_size(size_mb: float, args: argparse.Namespace) -> dict:
    corpus = build_corpus(args.books, size_mb, args.scratch / f"{size_mb:g}MB")
    cache = fresh_dir(args.scratch / f"cache-{size_mb:g}MB")
    directory = Path(corpus["directory"])
    row = {"size_mb": size_mb, **corpus, "cache": str(cache)}
    for kind in ("encode", "start", "pipeline", "train"):
        row[kind] = _run_child(kind, directory, cache, args)
    row["pipeline_per_step"] = row["pipeline"]["batches_per_sec"] / row["train"]["step_batches_per_sec"]
    return row


def target(name: str, value: float, limit: float, at_least: bool) -> dict:
    met = value >= limit if at_least else value <= limit
    return {"target": name, "value": value, "limit": limit, "of_limit": value / limit, "met": met}


def targets(rows: list[dict]) -> list[dict]:
    found = []
    for r in rows:
        label = f"{r['size_mb']:g} MB"
        found.append(
            target(f"encoding >= {ENCODE_MB_PER_S:g} MB/s, {label}", r["encode"]["mb_per_sec"], ENCODE_MB_PER_S, True)
        )
    for r in rows:
        label = f"{r['size_mb']:g} MB"
        found.append(target(f"warm start <= {WARM_START_S:g} s, {label}", r["start"]["seconds"], WARM_START_S, False))
    small, large = min(rows, key=lambda r: r["size_mb"]), max(rows, key=lambda r: r["size_mb"])
    rss = large["train"]["peak_rss_mb"]
    found.append(target(f"peak RSS <= {PEAK_RSS_MB:,.0f} MB, {large['size_mb']:g} MB", rss, PEAK_RSS_MB, False))
    if large is not small:
        spread = rss - small["train"]["peak_rss_mb"]
        name = f"peak RSS {large['size_mb']:g} MB - {small['size_mb']:g} MB <= {RSS_SPREAD_MB:g} MB"
        found.append(target(name, spread, RSS_SPREAD_MB, False))
    return found


def print_table(report: dict) -> None:
    rows = report["corpora"]
    print(
        f"textgen scale ({report['date']}, {report['cores']} cores, load {report['load_avg_1m_before']:.2f} -> "
        f"{report['load_avg_1m_after']:.2f}; REF 1 x {REF['units']}, batch {REF['batch_size']} x {REF['seq_len']}; "
        f"MB = 10^6 bytes)"
    )
    header = (
        f"{'corpus':>9} {'files':>6} {'encode s':>9} {'MB/s':>7} {'import TF s':>12} {'warm start s':>13} "
        f"{'pipeline b/s':>13} {'step b/s':>9} {'pipe/step':>10} {'peak RSS MB':>12} {'other CPU':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        others = max(r[k]["other_cpu_cores"] for k in ("encode", "start", "pipeline", "train"))
        print(
            f"{r['bytes'] / MB:>6.1f} MB {r['files']:>6} {r['encode']['seconds']:>9.2f} "
            f"{r['encode']['mb_per_sec']:>7.1f} {r['start']['import_tf_s']:>12.2f} {r['start']['seconds']:>13.2f} "
            f"{r['pipeline']['batches_per_sec']:>13,.0f} {r['train']['step_batches_per_sec']:>9.2f} "
            f"{r['pipeline_per_step']:>9,.0f}x {r['train']['peak_rss_mb']:>12,.0f} {others:>10.2f}"
        )
    print("warm start, by part (s): files found + encodings detected + fingerprinted / load_splits / first batch")
    for r in rows:
        s = r["start"]
        print(
            f"  {r['size_mb']:g} MB: {s['files_s']:.2f} / {s['load_splits_s']:.2f} / {s['first_batch_s']:.2f}; "
            f"process start to first batch {s['launch_s'] + s['import_tf_s'] + s['seconds']:.2f}"
        )
    print(f"peak RSS over {report['batches']} training batches (MB; after loading and building the trainer):")
    for r in rows:
        t = r["train"]
        print(
            f"  {r['size_mb']:g} MB: {t['peak_rss_mb']:,.0f} ({t['setup_rss_mb']:,.0f} before the first step); "
            f"encoding's own peak {r['encode']['peak_rss_mb']:,.0f}; {t['chars_per_sec']:,.0f} chars/s trained"
        )
    if len(rows) > 1:
        small, large = rows[0], rows[-1]
        scale = large["bytes"] / small["bytes"]
        print(
            f"scaling {large['size_mb']:g} MB against {small['size_mb']:g} MB (x{scale:.1f} the bytes): encoding time "
            f"x{large['encode']['seconds'] / small['encode']['seconds']:.1f}, warm start "
            f"x{large['start']['seconds'] / small['start']['seconds']:.2f}, pipeline batches/s "
            f"x{large['pipeline']['batches_per_sec'] / small['pipeline']['batches_per_sec']:.2f}, peak RSS "
            f"x{large['train']['peak_rss_mb'] / small['train']['peak_rss_mb']:.2f}"
        )
    print("targets:")
    for t in report["targets"]:
        print(
            f"  {t['target']:<42} {t['value']:>10,.2f}  ({t['of_limit']:.2f}x the limit)  "
            f"{'met' if t['met'] else 'MISSED'}"
        )


def parse_sizes(text: str) -> list[float]:
    try:
        sizes = sorted({float(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are MB separated by commas, like 10,100 (got {text!r})") from None
    if not sizes or sizes[0] <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive MB (got {text!r})")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, help="corpus sizes in MB, comma-separated (default 10,100)")
    parser.add_argument("--quick", action="store_true", help="1 MB and 5 MB, 2 s of pipeline: a smoke run")
    parser.add_argument("--batches", type=int, default=30, help="training batches per corpus (at least 3)")
    parser.add_argument("--seconds", type=float, help="seconds of the pipeline alone (default 10, 2 with --quick)")
    parser.add_argument("--books", type=Path, default=DEFAULT_BOOKS, help="the books to build corpora from")
    parser.add_argument("--scratch", type=Path, default=DEFAULT_SCRATCH, help="where corpora and id caches go")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    if args.batches < 3:
        parser.error("--batches must be at least 3 (2 warm-up steps, then at least one timed)")
    args.sizes = args.sizes or ([1.0, 5.0] if args.quick else [10.0, 100.0])
    args.seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 10.0)
    args.books, args.scratch = args.books.expanduser().resolve(), args.scratch.expanduser().resolve()
    if args.scratch.is_relative_to(REPO):
        parser.error(f"--scratch {args.scratch} is inside the repo; corpora go elsewhere")

    load_before, started = os.getloadavg()[0], time.perf_counter()
    rows = [measure_size(size, args) for size in args.sizes]
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "books": str(args.books),
        "batches": args.batches,
        "pipeline_seconds": args.seconds,
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "seconds": time.perf_counter() - started,
        "corpora": rows,
        "targets": targets(rows),
    }
    report["all_targets_met"] = all(t["met"] for t in report["targets"])
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
