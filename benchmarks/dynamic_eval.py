"""Dynamic evaluation against static scoring, for one trained run (issue 57, part 2).

    python benchmarks/dynamic_eval.py --run-dir checkpoints/2600-0
    python benchmarks/dynamic_eval.py --run-dir checkpoints/2600-0 --documents 5

First the run's test split, read as one stream in segments, static and dynamic (``textgen evaluate --dynamic``:
the run's dynamic.json settings, tuned on its validation split first if it has none), with the ratio and the
seconds each took. With ``--documents N``: N books of ``--corpora`` the run never trained on (not War and Peace,
nor a file of the run's corpus), each cleaned of Project Gutenberg's header and footer; from ``--skip`` of the way
in (past the front matter), the first ``--prompt-chars`` characters are read and the next ``--score-chars``
scored three ways: static; with the weights adapted to the prompt only, then frozen (what ``textgen sample
--prime-file DOC --adapt`` continues from); and adapting throughout, the scored text included (dynamic
evaluation proper). A table, one row a book and their mean, in nats per character.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPORA = ROOT.parent / "shared" / "corpora" / "gutenberg"
WAR_AND_PEACE = ("2600-0.txt", "pg2600.txt")


def held_out_books(corpora: Path, run_files: set[str], count: int, need: int) -> list[Path]:
    """``count`` books of ``corpora`` (by name) that are not War and Peace nor one the run trained on, and hold at
    least ``need`` characters' worth of bytes."""
    books = []
    for path in sorted(corpora.glob("*.txt")):
        if path.name in WAR_AND_PEACE or str(path.resolve()) in run_files or path.stat().st_size < need:
            continue
        books.append(path)
        if len(books) == count:
            break
    return books


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path, help="the trained run's directory")
    parser.add_argument("--documents", type=int, default=0, help="also score N held-out books (default: none)")
    parser.add_argument("--corpora", type=Path, default=DEFAULT_CORPORA, help="where the held-out books are")
    parser.add_argument("--prompt-chars", type=int, default=20_000)
    parser.add_argument("--score-chars", type=int, default=5_000)
    parser.add_argument("--skip", type=float, default=0.1, help="start this far into each book (default: 0.1)")
    parser.add_argument("--no-test", action="store_true", help="skip the test split (documents only)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of tables")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(ROOT))
    from textgen import api
    from textgen.config import Split

    run_dir = args.run_dir.resolve()
    if not args.no_test:
        result = api.evaluate_dynamic(checkpoint_dir=run_dir.parent, run_name=run_dir.name, split=Split.test)
        if args.json:
            print(json.dumps({"what": "test split", **vars(result)}), flush=True)
        else:
            if result.tuned_seconds is not None:
                print(f"tuned on the validation split in {result.tuned_seconds:.0f} s")
            print(f"{result.run}, {result.source}, {result.chars:,} characters as one stream; eta {result.eta:g}, "
                  f"decay {result.decay:g}, segments of {result.segment_len}")  # fmt: skip
            print(f"  static   {result.static_nats_per_char:.4f} nats/char  {result.static_seconds:7.1f} s")
            print(f"  dynamic  {result.dynamic_nats_per_char:.4f} nats/char  {result.dynamic_seconds:7.1f} s")
            print(
                f"  ratio    {result.ratio:.4f}   ({result.dynamic_nats_per_char - result.static_nats_per_char:+.4f})"
            )
    if args.documents > 0:
        documents(args, run_dir)


def documents(args: argparse.Namespace, run_dir: Path) -> None:
    """Score the held-out books' continuations static, prompt-adapted and adapting throughout."""
    import numpy as np

    from textgen.checkpoint import Run
    from textgen.config import DynamicConfig, Weights
    from textgen.corpus import read_corpus
    from textgen.device import configure_for_inference
    from textgen.dynamic import open_evaluator, read_settings

    configure_for_inference()
    run = Run(run_dir)
    cfg, vocab = run.load_config(), run.load_vocab()
    settings = read_settings(run) or DynamicConfig()
    length = settings.segment_len
    if args.prompt_chars % length:
        sys.exit(f"--prompt-chars must be a multiple of the segment length {length}")
    frozen, static = DynamicConfig(0.0, 0.0, length), DynamicConfig(0.0, settings.decay, length)
    evaluator = open_evaluator(run, Weights.best, length)
    need = args.prompt_chars + args.score_chars + 1
    run_files = {str(Path(f).resolve()) for f in cfg.data.paths}
    books = held_out_books(args.corpora, run_files, args.documents, int(need / (1 - args.skip)) + 1)
    first_scored = args.prompt_chars // length  # the segments after the prompt's
    rows = []
    for book in books:
        text = read_corpus(book, strip_boilerplate=True, encoding="auto")
        start = int(len(text) * args.skip)
        ids = vocab.encode(text[start : start + need])
        if len(ids) < need:
            continue
        started = time.monotonic()
        plain = evaluator.segment_losses(ids, static)[first_scored:].sum()
        throughout = evaluator.segment_losses(ids, settings)[first_scored:].sum()
        evaluator.segment_losses(ids[: args.prompt_chars + 1], settings)
        prompted = evaluator.segment_losses(ids[args.prompt_chars :], frozen, restore=False).sum()
        chars = args.score_chars
        row = {
            "book": book.name,
            "static": plain / chars,
            "prompt_adapted": prompted / chars,
            "adapting": throughout / chars,
            "seconds": time.monotonic() - started,
        }
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    evaluator.restore()
    if not rows:
        sys.exit(f"no held-out book of {args.corpora} holds {need:,} characters")
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("static", "prompt_adapted", "adapting", "seconds")}
    if args.json:
        print(json.dumps({"book": "mean", **mean}))
        return
    print(f"\n{len(rows)} held-out books: {args.prompt_chars:,} characters read, the next {args.score_chars:,} "
          f"scored (nats/char); eta {settings.eta:g}, decay {settings.decay:g}, segments of {length}")  # fmt: skip
    print(f"{'book':<16} {'static':>8} {'prompt-adapted':>15} {'adapting':>9} {'seconds':>8}")
    for r in [*rows, {"book": "mean", **mean}]:
        print(f"{r['book']:<16} {r['static']:8.4f} {r['prompt_adapted']:15.4f} {r['adapting']:9.4f} "
              f"{r['seconds']:8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
