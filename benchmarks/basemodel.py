"""Build the base model the package ships (textgen/base/en/) and measure its card (docs/base-model.md).

    TEXTGEN_CORPUS_PATH=../shared/corpora .venv/bin/python benchmarks/basemodel.py --time-budget 120m
    .venv/bin/python benchmarks/basemodel.py --score-only          # the card's figures of the model shipped now

1. Trains run ``base-en`` in ``--checkpoint-dir`` on the Project Gutenberg books of CORPUS/gutenberg/ (their text
   between Gutenberg's markers, as ``textgen train`` keeps it), **leaving out** the four books of at least 1 MB that
   ``benchmarks/finetune.py`` measures on (``HELD_OUT``), so that fine-tuning figures are of text the base never
   saw, and the two that are not in the public domain (``NOT_PUBLIC_DOMAIN``). The recipe is the best 2-hour one of
   docs/quality.md (two layer-normalized layers of 512, dropout 0.1, cosine schedule), seed 0; the vocabulary starts
   with ``basemodel.BASE_CHARS`` (what users' English text holds) and is extended by the books' own characters.
2. Exports its best weights as LiteRT float16 into textgen/base/en/ (the package's data: run nothing else from the
   checkout meanwhile).
3. Scores the export, without TensorFlow, on the test split of each held-out book and of War and Peace (the last 5%
   of its kept text, as ``textgen train`` splits a single file; written to ``--work-dir``), read as one stream
   (``textgen evaluate --run base:en FILE --streams 1``), and prints the card's table (``--json``: one record).
4. Measures its size and ``textgen sample``'s time to a first character with no run trained (on the base).

Two hours of training on 2 cores: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from deploy import disk_size, first_character_seconds, gzip_size

from textgen import api
from textgen.artifact import ExportFormat, Quantize
from textgen.basemodel import BASE_CHARS, BASE_NAME, base_dir
from textgen.config import DataConfig, Device, LRSchedule
from textgen.corpus import read_corpus
from textgen.durations import parse_duration
from textgen.idcache import split_sizes
from textgen.settings import DataSettings, ModelSettings, TrainRequest, TrainSettings

CORPORA = Path(os.environ.get("TEXTGEN_CORPUS_PATH", "../shared/corpora"))
# The books benchmarks/finetune.py fine-tunes on (the shared books with at least 1 MB of text): never trained on.
HELD_OUT = ("1400-0.txt", "pg1497.txt", "pg3207.txt", "4300-0.txt")
# Not public domain: Project Gutenberg carries them with their copyright holders' permission ("This is a COPYRIGHTED
# Project Gutenberg eBook": Barrie's Peter Pan, Wyllie's translation of Metamorphosis). The model is of public-domain
# text only.
NOT_PUBLIC_DOMAIN = ("16-0.txt", "pg5200.txt")
WAR_AND_PEACE = "2600-0.txt"
RUN = "base-en"
RECIPE: dict[str, Any] = {"layers": 2, "units": 512, "dropout": 0.1, "layer_norm": True}


def train(args: argparse.Namespace) -> None:
    from rich.console import Console

    from textgen.trainview import TrainingDisplay

    books = sorted(p for p in (CORPORA / "gutenberg").glob("*.txt") if p.name not in HELD_OUT + NOT_PUBLIC_DOMAIN)
    print(f"training {RUN} on {len(books)} books ({sum(p.stat().st_size for p in books):,} bytes)", file=sys.stderr)
    request = TrainRequest(
        tuple(str(p) for p in books),
        device=Device.cpu,
        checkpoint_dir=args.checkpoint_dir,
        run_name=RUN,
        data=DataSettings(base_vocab=BASE_CHARS),
        model=ModelSettings(**RECIPE),
        training=TrainSettings(time_budget=args.time_budget, lr_schedule=LRSchedule.cosine, seed=0, sample_every=0),
    )
    api.train(request, TrainingDisplay(Console(stderr=True)))
    result = api.export(
        checkpoint_dir=args.checkpoint_dir,
        run_name=RUN,
        format=ExportFormat.litert,
        quantize=Quantize.float16,
        path=base_dir(),
    )
    print(f"exported {RUN} to {result.path} ({result.bytes:,} bytes)", file=sys.stderr)


def test_split(book: Path, work_dir: Path) -> Path:
    """The test split ``textgen train`` would make of ``book`` alone (the last 5% of its kept text), as a file."""
    text = read_corpus(book)
    test = split_sizes(len(text), DataConfig.val_fraction, DataConfig.test_fraction)[2]
    path = work_dir / f"{book.stem}-test.txt"
    path.write_text(text[len(text) - test :], encoding="utf-8")
    return path


def score(args: argparse.Namespace) -> list[dict[str, Any]]:
    args.work_dir.mkdir(parents=True, exist_ok=True)
    books = [CORPORA / "gutenberg" / name for name in HELD_OUT] + [CORPORA / WAR_AND_PEACE]
    rows = []
    for book in books:
        evaluation = api.evaluate(run_name=BASE_NAME, file=str(test_split(book, args.work_dir)), streams=1)
        rows.append({"book": book.name, "chars": evaluation.chars, "nats_per_char": evaluation.nats_per_char})
    return rows


def startup(repeats: int = 5) -> dict[str, Any]:
    """What a newcomer meets: the package's model on disk, and ``textgen sample`` with no run trained (so on the
    base model) from a fresh process's start to its first character, the median of ``repeats``."""
    with tempfile.TemporaryDirectory() as empty:
        seconds = [first_character_seconds(["--checkpoint-dir", empty]) for _ in range(repeats)]
    return {
        "bytes": disk_size(base_dir()),
        "gzipped_bytes": gzip_size(base_dir()),
        "first_char_s": statistics.median(seconds),
        "first_char_s_max": max(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-budget", type=parse_duration, default=parse_duration("120m"))
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/textgen-base"))
    parser.add_argument("--score-only", action="store_true", help="score the base model shipped now")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.score_only:
        train(args)
    rows = score(args)
    first_use = startup()
    if args.json:
        print(json.dumps({"model": BASE_NAME, "test": rows, "startup": first_use}))
        return
    print("| held-out text (test split) | characters | nats/char |\n|---|---:|---:|")
    for row in rows:
        print(f"| {row['book']} | {row['chars']:,} | {row['nats_per_char']:.4f} |")
    print(
        f"\n{first_use['bytes'] / 1e6:.2f} MB in the package ({first_use['gzipped_bytes'] / 1e6:.2f} MB gzipped); "
        f"`textgen sample` with no run, start to first character: {first_use['first_char_s']:.2f} s median of 5 "
        f"(max {first_use['first_char_s_max']:.2f} s)"
    )


if __name__ == "__main__":
    main()
