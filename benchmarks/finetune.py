"""Fine-tuning against training from scratch, on books no run has seen (issue 44).

    python benchmarks/finetune.py --base wp --checkpoint-dir checkpoints
    python benchmarks/finetune.py --base wp --seeds 0 --budgets 2m --dry-run   # the commands, run nothing
    python benchmarks/finetune.py --base wp --sizes 50k --books ../shared/corpora/gutenberg/1400-0.txt \\
        --budgets 1m --warmups 0 100 300                                        # how long to warm up
    python benchmarks/finetune.py --base base:en --train-flags "--weight-drop 0.25 --seq-len 64"   # every new run
    python benchmarks/finetune.py --base base:en --train-flags=--layer-norm   # one flag alone needs the =

``--base`` is a War and Peace run trained by the default recipe, already in ``--checkpoint-dir`` (this script does
not train it), or ``base:en``, the base model in the package (docs/base-model.md), which never saw War and Peace
(``--wp``) nor these books. ``--fine-tuned-only`` leaves out the scratch runs, to set one base beside another (each
in its own ``--checkpoint-dir``: the runs' names are the same). The books (``--books``) are Great Expectations (1400-0.txt, a 19th-century novel like War and Peace)
and Plato's Republic in Jowett's translation (pg1497.txt, a dialogue, far from it): of the 30 shared books only
these, Leviathan and Ulysses have 1 MB of text between Project Gutenberg's markers. Each book's text between the
markers, as ``textgen train`` keeps it, is cut to its first 50 KB and 1 MB (``--sizes``: UTF-8 bytes, 1 KB = 1,000,
ending on a whole line) and written to ``--work-dir``; ``textgen train`` splits each cut as usual (the last 10%: 5%
validation, then 5% test).

For each book x size x seed (``--seeds``), two runs: ``train CUT --init-from BASE`` (fine-tuned) and ``train CUT``
with the base's --units, --layers, --embedding-dim, --dropout and --layer-norm from its config.json (scratch), both
``--sample-every 0`` (a sample after each of a 50 KB text's many short epochs would eat the budget), and both
``--train-flags``. A fine-tune of a text under 100,000 characters has weight-drop and locked output dropout by
default, a scratch run not: give ``--train-flags "--weight-drop 0.25 --locked-output-dropout 0.2"`` to set the two
alike (tables measured before that default, docs/finetuning.md, compare the unregularized fine-tune). Each is trained
to the first of ``--budgets``, measured, then continued with ``train --resume --time-budget NEXT`` (a whole-run
budget) and measured again: 10 m costs 10 m, not 2 + 10. The cosine schedule anneals over the budget the run has at
the time, so a run continued from 2 m to 10 m restarts near its peak rate (90% of it at 2/10 of the way): the later
numbers are of a continued run, not of one planned for 10 m, alike for both runs. Measured at each budget:

* test nats/char: ``textgen evaluate --run R --split test --streams S`` (best weights), S the fine-tuned run's batch
  size for both runs (their batch layouts are the same anyway: same text); difference: fine-tuned minus scratch
  (negative: fine-tuning is better). A 50 KB cut's test split is 2.5 KB: in 64 streams of 39 characters, each read
  from the zero state as training reads, so the figure is mostly that of text read cold. Also in one stream
  (``--streams 1``), the way a reader meets it;
* the base with no fine-tuning, on each cut's test split (written to WORK/BOOK-SIZE.test.txt) in S streams and in one:
  what fine-tuning buys over using the base as it is;
* scratch reaches fine-tuned: the first row of the scratch run's history.csv (a row per epoch, read after the last
  budget) whose validation loss is at or below the fine-tuned run's best validation loss at that budget; its
  ``seconds`` column, the run's own training clock over all invocations (what --time-budget counts). Accurate to an
  epoch (seconds at 50 KB, about a minute at 1 MB); "-": not within the last budget;
* WP test before / after (forgetting): War and Peace's test split (the last test_fraction of the base's text as
  textgen cleans it) written to WORK/wp-test.txt and scored by ``textgen evaluate FILE --streams B`` (B: the base's
  batch size, for every run): before is the base run, after the fine-tuned run; the base's own ``--split test`` score
  is kept in the JSON as a check of that text;
* verbatim: of ``textgen sample --length 300 --seed 0`` (best weights, default temperature), the fraction of its
  20-character windows found anywhere in the cut's training part (its first 90%); the base run's sample on the same
  terms, under the table, is the share common phrases alone give.

Runs are named ft-BOOK-SIZE-sSEED and scratch-BOOK-SIZE-sSEED; those names must be free. With the defaults, 8 pairs
of 10-minute runs: about 160 minutes of training and 15 of start-ups and scoring (``--seeds 0`` halves it). Run
nothing else meanwhile: 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from textgen.basemodel import BASE_NAME
from textgen.config import DataConfig, ModelConfig
from textgen.durations import format_seconds, parse_duration

GUTENBERG = Path("../shared/corpora/gutenberg")
BOOKS = [str(GUTENBERG / "1400-0.txt"), str(GUTENBERG / "pg1497.txt")]
WAR_AND_PEACE = Path("../shared/corpora/2600-0.txt")
WINDOW = 20  # characters: a shared window is mostly copied text, not chance (the base run's sample says how much is)
UNITS = {"k": 1_000, "m": 1_000_000}
KINDS = {"ft": "fine_tuned", "scratch": "scratch"}


def textgen(args: list[str], dry_run: bool) -> list[dict[str, Any]]:
    """A textgen command with --json: its JSON lines (stops the benchmark if it fails); printed, not run, with
    ``dry_run`` ([{}] then, so that every number comes out NaN)."""
    command = [sys.executable, "-m", "textgen", *args, "--json"]
    if dry_run:
        print(shlex.join(command))
        return [{}]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def parse_size(text: str) -> int:
    """Bytes in ``50k``, ``1m`` or ``2000``."""
    unit = UNITS.get(text[-1:].lower(), 1)
    return int(float(text.rstrip("kKmM")) * unit)


def cut_text(book: Path, size: int) -> str:
    """The first ``size`` bytes of ``book``'s text between Gutenberg's markers, ending on a whole line."""
    from textgen.corpus import read_corpus

    data = read_corpus(book, encoding="auto").encode()
    if len(data) < size:
        raise SystemExit(f"{book} has {len(data):,} bytes of text, fewer than {size:,}: pick a longer book")
    text = data[:size].decode(errors="ignore")  # a character cut in two is dropped
    return text[: text.rfind("\n") + 1]


def split_text(
    text: str, val_fraction: float = DataConfig.val_fraction, test_fraction: float = DataConfig.test_fraction
) -> tuple[str, str]:
    """The parts of ``text`` textgen trains and tests on: the first and the last (the default split fractions)."""
    from textgen.idcache import split_sizes

    train, _, test = split_sizes(len(text), val_fraction, test_fraction)
    return text[:train], text[len(text) - test :]


def wp_test_text(data: dict[str, Any]) -> str:
    """The test split of the base run's corpus (``data``: its config's data section), as text."""
    from textgen.corpus import read_corpus

    if len(data.get("files") or []) > 1:  # a run of one file lists it too
        raise SystemExit("the base run trained on several files; give one trained on War and Peace alone")
    text = read_corpus(data["corpus"], data["strip_boilerplate"], data["encoding"])
    return split_text(text, data["val_fraction"], data["test_fraction"])[1]


def write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf-8") != text:  # a run's corpus must not change under it
        path.write_text(text, encoding="utf-8")


def run_config(checkpoint_dir: Path, run: str) -> dict[str, Any]:
    path = checkpoint_dir / run / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    """The base's config as a run's config.json has it: a run's own, or for base:en (the package's export, which
    never saw War and Peace) its model and batch size, and War and Peace (``--wp``) as the text to forget."""
    if args.base != BASE_NAME:
        return run_config(args.checkpoint_dir, args.base)
    from textgen.artifact import ArtifactInfo
    from textgen.basemodel import base_path

    info = ArtifactInfo.read(base_path())
    data = DataConfig(str(args.wp), batch_size=info.batch_size, seq_len=info.seq_len)
    return {"model": dataclasses.asdict(info.model), "data": dataclasses.asdict(data)}


def shape_flags(model: dict[str, Any]) -> list[str]:
    """The flags that give a scratch run the base's model (and its dropout, as a fine-tuned run has it)."""
    flags = ["--units", str(model["units"]), "--layers", str(model["layers"])]
    flags += ["--embedding-dim", str(model["embedding_dim"]), "--dropout", str(model["dropout"])]
    return flags + (["--layer-norm"] if model.get("layer_norm") else [])


def windows(text: str) -> set[str]:
    return {text[i : i + WINDOW] for i in range(len(text) - WINDOW + 1)}


def verbatim(sample: str, seen: set[str]) -> float | None:
    """The fraction of ``sample``'s 20-character windows in ``seen``."""
    found = [sample[i : i + WINDOW] in seen for i in range(len(sample) - WINDOW + 1)]
    return sum(found) / len(found) if found and seen else None


def score(run: str, args: argparse.Namespace, streams: str, file: Path | None = None) -> dict[str, Any]:
    """``textgen evaluate``'s record of ``run`` on ``file``, or on its test split."""
    where = [str(file)] if file else ["--split", "test"]
    command = ["evaluate", *where, "--run", run, "--streams", streams, "--checkpoint-dir", str(args.checkpoint_dir)]
    return textgen(command, args.dry_run)[0]


def sample(run: str, args: argparse.Namespace) -> str:
    command = ["sample", "--run", run, "--length", str(args.sample_length), "--seed", "0"]
    return str(textgen([*command, "--checkpoint-dir", str(args.checkpoint_dir)], args.dry_run)[0].get("text", ""))


def train(
    kind: str, name: str, cut: Path, budget: str, first: bool, seed: int, shape: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Train run ``name`` (a new one if ``first``, else resumed) up to ``budget`` in all: its final record."""
    if not first:
        command = ["train", "--resume", "--run", name]
    else:
        start = ["--init-from", args.base] if kind == "ft" else shape
        command = ["train", str(cut), *start, "--run", name, "--seed", str(seed), "--device", args.device]
        command += shlex.split(args.train_flags)
    command += ["--time-budget", budget, "--sample-every", "0", "--checkpoint-dir", str(args.checkpoint_dir)]
    done = textgen(command, args.dry_run)[-1]
    keys = ("epochs", "seconds", "best_val_loss", "start_val_loss", "stop_reason", "session_seconds")
    return {k: done.get(k) for k in keys}


def time_to_reach(history: dict[str, list[float]], target: float | None) -> float | None:
    """The run's clock at its first epoch end with a validation loss at or below ``target`` (None: never)."""
    pairs = zip(history.get("val_loss", []), history.get("seconds", []), strict=True)
    return min((s for loss, s in pairs if target is not None and loss <= target), default=None)


def measure_pair(
    book: str, size: str, cut: Path, seen: set[str], seed: int, shape: list[str], wp: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The fine-tuned and the scratch run of one cut and seed, measured at each budget: a row per budget."""
    from textgen.plot import read_history

    names = {kind: f"{kind}-{Path(book).stem}-{size}-s{seed}" for kind in KINDS}
    rows, streams = [], "FT_BATCH_SIZE"
    for i, budget in enumerate(args.budgets):
        row: dict[str, Any] = {"book": Path(book).name, "size": size, "budget": budget, "seed": seed}
        for kind, name in names.items():
            if kind == "scratch" and args.fine_tuned_only:
                continue
            stage: dict[str, Any] = {"run": name, "train": train(kind, name, cut, budget, i == 0, seed, shape, args)}
            if kind == "ft":  # both runs are scored as the same streams: the fine-tuned run's batch
                streams = str(run_config(args.checkpoint_dir, name).get("data", {}).get("batch_size", streams))
            stage["test"] = score(name, args, streams)
            stage["test_one_stream"] = score(name, args, "1")
            stage["sample"] = sample(name, args)
            stage["verbatim"] = verbatim(stage["sample"], seen)
            row[KINDS[kind]] = stage
            if not args.dry_run:
                print(f"{name} at {budget}: test {stage['test']['nats_per_char']:.4f}", file=sys.stderr, flush=True)
        row["wp_test_after"] = score(names["ft"], args, args.base_streams, wp)
        rows.append(row)
    if args.fine_tuned_only:
        return rows
    history = read_history(args.checkpoint_dir / names["scratch"] / "history.csv")
    for row in rows:
        row["scratch_reaches_s"] = time_to_reach(history, row["fine_tuned"]["train"]["best_val_loss"])
    return rows


def measure_warmups(book: str, size: str, cut: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Fine-tuned runs of one cut trained to the first budget with each ``--warmups``, per seed: their test loss."""
    rows = []
    for seed in args.seeds:
        for warmup in args.warmups:
            name = f"warmup{warmup}-{Path(book).stem}-{size}-s{seed}"
            command = ["train", str(cut), "--init-from", args.base, "--warmup", str(warmup), "--run", name, "--seed"]
            command += [str(seed), "--device", args.device, "--time-budget", args.budgets[0], "--sample-every", "0"]
            command += shlex.split(args.train_flags)
            textgen([*command, "--checkpoint-dir", str(args.checkpoint_dir)], args.dry_run)
            batch = str(run_config(args.checkpoint_dir, name).get("data", {}).get("batch_size", "FT_BATCH_SIZE"))
            test = score(name, args, batch).get("nats_per_char", math.nan)
            rows.append({"book": Path(book).name, "size": size, "seed": seed, "warmup": warmup, "test": test})
    return rows


def warmup_table(rows: list[dict[str, Any]], budget: str) -> str:
    """Test nats/char by warm-up, a column per seed and their mean."""
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"| book | size | --warmup | {' | '.join(f'seed {s}' for s in seeds)} | mean (at {budget}) |"]
    lines.append("|---|---|---:|" + "---:|" * (len(seeds) + 1))
    for key in dict.fromkeys((r["book"], r["size"], r["warmup"]) for r in rows):
        tests = [r["test"] for r in rows if (r["book"], r["size"], r["warmup"]) == key]
        cells = " | ".join(f"{t:.4f}" for t in tests)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {cells} | {statistics.fmean(tests):.4f} |")
    return "\n".join(lines)


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """The numbers of a row the tables show."""
    ft, from_scratch = row["fine_tuned"], row.get("scratch")  # none with --fine-tuned-only
    scratch = from_scratch["test"]["nats_per_char"] if from_scratch else math.nan
    return {
        **{k: row[k] for k in ("book", "size", "budget", "seed")},
        "ft_test": ft["test"]["nats_per_char"],
        "scratch_test": scratch,
        "ft_test_1": ft["test_one_stream"]["nats_per_char"],
        "scratch_test_1": from_scratch["test_one_stream"]["nats_per_char"] if from_scratch else math.nan,
        "difference": ft["test"]["nats_per_char"] - scratch,
        "scratch_reaches_s": row.get("scratch_reaches_s"),
        "wp_after": row["wp_test_after"]["nats_per_char"],
        "ft_verbatim": ft["verbatim"],
        "scratch_verbatim": from_scratch["verbatim"] if from_scratch else None,
    }


def averages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The flat rows averaged over seeds; the time to reach over the seeds that reached (``reached`` of ``seeds``)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in map(flat, rows):
        groups.setdefault((row["book"], row["size"], row["budget"]), []).append(row)
    means = []
    for (book, size, budget), group in groups.items():
        reached = [r["scratch_reaches_s"] for r in group if r["scratch_reaches_s"] is not None]
        numbers = ["ft_test", "scratch_test", "difference", "ft_test_1", "scratch_test_1", "wp_after"]
        numbers += ["ft_verbatim", "scratch_verbatim"]
        mean = {k: statistics.fmean(math.nan if r[k] is None else r[k] for r in group) for k in numbers}
        reach = statistics.fmean(reached) if reached else None
        means.append({"book": book, "size": size, "budget": budget, "seeds": len(group), "reached": len(reached)})
        means[-1].update(mean, scratch_reaches_s=reach)
    return means


def table(rows: list[dict[str, Any]], before: float, last: str, by_seed: bool) -> str:
    """A markdown table of flat (``by_seed``) or averaged rows."""
    first = "seed" if by_seed else "seeds (reached)"
    lines = [
        f"| book | size | budget | {first} | fine-tuned test nats/char | scratch test nats/char | difference | "
        "one stream, fine-tuned / scratch | scratch reaches fine-tuned val loss at | WP test before → after | "
        "verbatim 20-char windows, fine-tuned / scratch |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        who = r["seed"] if by_seed else f"{r['seeds']} ({r['reached']})"
        reach = format_seconds(r["scratch_reaches_s"]) if r["scratch_reaches_s"] is not None else f"not in {last}"
        lines.append(
            f"| {r['book']} | {r['size']} | {r['budget']} | {who} | {r['ft_test']:.4f} | {r['scratch_test']:.4f} | "
            f"{r['difference']:+.4f} | {r['ft_test_1']:.4f} / {r['scratch_test_1']:.4f} | {reach} | {before:.4f} → {r['wp_after']:.4f} | "
            f"{_share(r['ft_verbatim'])} / {_share(r['scratch_verbatim'])} |"
        )
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base", required=True, help="the War and Peace run to fine-tune (in --checkpoint-dir), or base:en"
    )
    parser.add_argument("--wp", type=Path, default=WAR_AND_PEACE, help="War and Peace, for base:en's forgetting")
    parser.add_argument("--fine-tuned-only", action="store_true", help="no scratch runs (compare bases)")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--books", nargs="+", default=BOOKS, help="text files no run has seen")
    parser.add_argument("--sizes", nargs="+", default=["50k", "1m"], help="cuts of each book, in UTF-8 bytes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--budgets", nargs="+", default=["2m", "10m"], help="textgen durations, increasing")
    parser.add_argument("--work-dir", type=Path, help="where the cut texts go (default: CHECKPOINT_DIR/finetune-texts)")
    parser.add_argument("--device", default="cpu", help="textgen train --device of the new runs")
    parser.add_argument(
        "--train-flags",
        default="",
        help='more textgen train flags for every new run, fine-tuned or scratch: "--dropout 0.3"',
    )
    parser.add_argument("--sample-length", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    parser.add_argument("--dry-run", action="store_true", help="print the textgen commands without running them")
    parser.add_argument(
        "--warmups", type=int, nargs="+", help="instead: fine-tune with each --warmup to the first budget, no scratch"
    )
    args = parser.parse_args()
    seconds = [parse_duration(b) for b in args.budgets]
    if seconds != sorted(set(seconds)):
        raise SystemExit("--budgets must increase: each continues the run trained to the one before")
    work = args.work_dir or args.checkpoint_dir / "finetune-texts"
    config = base_config(args)
    if not config and not args.dry_run:
        raise SystemExit(f"no run {args.base!r} in {args.checkpoint_dir}/: train it first (the default recipe)")
    model = config.get("model") or dataclasses.asdict(ModelConfig(vocab_size=1))  # a dry run without the base
    args.base_streams = str(config.get("data", {}).get("batch_size", "BASE_BATCH_SIZE"))
    shape, wp = shape_flags(model), work / "wp-test.txt"
    if not args.dry_run:
        work.mkdir(parents=True, exist_ok=True)
        write(wp, wp_test_text(config["data"]))
    base = {
        "run": args.base,
        "model": model,
        "wp_test_file": str(wp),
        "wp_test_before": score(args.base, args, args.base_streams, wp),
        "sample": sample(args.base, args),
    }
    if args.base != BASE_NAME:  # an export has no splits
        base["wp_split_test"] = score(args.base, args, args.base_streams)  # the same text as the file: a check
    rows, cuts = [], []
    for book in args.books:
        for size in args.sizes:
            text, cut = cut_text(Path(book), parse_size(size)), work / f"{Path(book).stem}-{size}.txt"
            seen = set() if args.dry_run else windows(split_text(text)[0])  # 1 MB: ~1M windows, ~100 MB
            if not args.dry_run:
                write(cut, text)
            cut_record = {"book": Path(book).name, "size": size, "path": str(cut), "bytes": len(text.encode())}
            cut_record.update(chars=len(text), train_chars=len(split_text(text)[0]))
            cuts.append({**cut_record, "base_verbatim": verbatim(base["sample"], seen)})
            if args.warmups:
                rows += measure_warmups(book, size, cut, args)
                continue
            for seed in args.seeds:
                rows += measure_pair(book, size, cut, seen, seed, shape, wp, args)
            streams = str(rows[-1]["fine_tuned"]["test"].get("streams", "FT_BATCH_SIZE"))
            test = work / f"{Path(book).stem}-{size}.test.txt"
            if not args.dry_run:
                write(test, split_text(text)[1])
            cuts[-1]["base_test"] = score(args.base, args, streams, test)
            cuts[-1]["base_test_one_stream"] = score(args.base, args, "1", test)
    if args.dry_run:
        return
    if args.warmups:
        print(json.dumps(rows) if args.json else warmup_table(rows, args.budgets[0]))
        return
    before = base["wp_test_before"]["nats_per_char"]
    means = averages(rows)
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        print(json.dumps({"settings": settings, "base": base, "cuts": cuts, "rows": rows, "averages": means}))
        return
    as_split = f" ({base['wp_split_test']['nats_per_char']:.4f} scored as its split)" if "wp_split_test" in base else ""
    print(f"base {args.base}: War and Peace test {before:.4f} nats/char{as_split}\n")
    print(table([flat(r) for r in rows], before, args.budgets[-1], by_seed=True))
    print(f"\naveraged over seeds:\n{table(means, before, args.budgets[-1], by_seed=False)}\n")
    for c in cuts:
        as_is = (
            f"{c['base_test']['nats_per_char']:.4f} ({c['base_test_one_stream']['nats_per_char']:.4f} in one stream)"
        )
        print(f"{c['book']} {c['size']}: the base with no fine-tuning scores {as_is} on test", end="")
        print(f"; its sample has {_share(c['base_verbatim'])} verbatim windows")
    for row in rows:
        for kind in (k for k in KINDS.values() if k in row):
            print(f"\n{row[kind]['run']} at {row['budget']}:\n```\n{row[kind]['sample']}\n```")


if __name__ == "__main__":
    main()
