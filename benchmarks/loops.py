"""Greedy decoding's loops, and what frequency and presence penalties do to them (issue 59).

``--prompts`` (64) prompts of 20 characters, cut from the run's training split at random word starts (as
``short_prompts.py`` cuts them), are continued greedily (temperature 0) for ``--length`` (2,000) characters as one
batch, once per setting: no penalty, then each ``--frequency`` and ``--presence`` penalty alone (by default from
0.003 to 0.6, and from 0.3 to 2). A sample *ends in a
loop* when its last ``WINDOW`` (200) characters repeat the ``WINDOW`` before them shifted by a period of at most
``WINDOW`` characters (``text[-200:] == text[-200-p:-p]`` for some p <= 200): it has fallen into a cycle and would
repeat it for ever. For each setting: the share of samples that end in a loop, the median period among them, the
median character at which the loop begins (from where the text is periodic to its end), the distinct words of the
samples, and the share of their words (split at spaces and newlines, punctuation stripped) that the training split
holds, in the first and in the last ``TAIL`` characters: a penalty that ends the loops by driving the text into
characters the book hardly uses (a frequency penalty grows with every repeat, and a character model repeats ``e``
hundreds of times in 2,000 characters) shows there.

    PYTHONPATH=. python benchmarks/loops.py --run /work/runs/e10/2600-0
    PYTHONPATH=. python benchmarks/loops.py --run checkpoints/2600-0 --frequency 0.3 0.6 --presence 0.6 --json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import numpy as np
from short_prompts import text_prompts

WINDOW = 200  # characters that must repeat, and the longest period looked for
TAIL = 500  # characters at a sample's start and end whose words are looked up in the book
PUNCTUATION = ".,;:!?\"'()[]-—“”‘’_*"


def loop_of(text: str) -> tuple[int, int] | None:
    """(period, first character of the loop) if ``text`` ends in a loop, else None. The smallest period is taken;
    the loop begins where ``text[i] == text[i + period]`` stops holding, going back from the end."""
    if len(text) < 2 * WINDOW:
        return None
    for period in range(1, WINDOW + 1):
        if text[-WINDOW:] == text[-WINDOW - period : -period]:
            start = len(text) - WINDOW - period
            while start > 0 and text[start - 1] == text[start - 1 + period]:
                start -= 1
            return period, start
    return None


def words(text: str) -> list[str]:
    return [w for w in (w.strip(PUNCTUATION) for w in text.split()) if w]


def book_share(text: str, book: set[str]) -> float:
    """The share of ``text``'s words that are words of the book (1.0 for a text without any)."""
    found = words(text)
    return sum(w in book for w in found) / len(found) if found else 1.0


def measure(run_dir: Path, prompts: int, length: int, settings: list[tuple[float, float]]) -> dict:
    from textgen import api
    from textgen.checkpoint import Run
    from textgen.genconfig import SampleConfig
    from textgen.startstate import train_ids

    sampler, _ = api.open_generator(checkpoint_dir=run_dir.parent, run_name=run_dir.name)
    ids = train_ids(Run(run_dir), None, limit=None)
    if ids is None:
        raise SystemExit(f"{run_dir}: its corpus is gone or changed; the benchmark needs its training split")
    given = text_prompts(ids, sampler.vocab, prompts, np.random.default_rng(0))
    book = set(words(sampler.vocab.decode(ids)))
    result: dict = {"run": str(run_dir), "prompts": prompts, "length": length, "rows": []}
    for frequency, presence in settings:
        config = SampleConfig(
            length=length, temperature=0.0, seed=0, frequency_penalty=frequency, presence_penalty=presence
        )
        began = time.monotonic()
        texts = sampler.generate(given, config)
        seconds = time.monotonic() - began
        loops = [loop for loop in map(loop_of, texts) if loop is not None]
        result["rows"].append(
            {
                "setting": f"frequency {frequency:g}, presence {presence:g}",
                "looping": len(loops),
                "samples": len(texts),
                "median_period": statistics.median(p for p, _ in loops) if loops else None,
                "median_loop_start": statistics.median(s for _, s in loops) if loops else None,
                "distinct_words": len({w for t in texts for w in words(t)}),
                "book_words_first": statistics.mean(book_share(t[:TAIL], book) for t in texts),
                "book_words_last": statistics.mean(book_share(t[-TAIL:], book) for t in texts),
                "seconds": round(seconds, 2),
                "example": texts[0][-300:],
            }
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, type=Path, help="a run directory")
    parser.add_argument("--prompts", type=int, default=64, help="prompts, generated as one batch")
    parser.add_argument("--length", type=int, default=2000, help="characters generated per prompt")
    parser.add_argument(
        "--frequency", type=float, nargs="*", default=[0.003, 0.01, 0.03, 0.1, 0.3, 0.6], help="frequency penalties"
    )
    parser.add_argument("--presence", type=float, nargs="*", default=[0.3, 0.6, 1.0, 2.0], help="presence penalties")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = [(0.0, 0.0), *((f, 0.0) for f in args.frequency), *((0.0, p) for p in args.presence)]
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, greedy, window {WINDOW}")
    result = measure(args.run, args.prompts, args.length, settings)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return
    print(f"{result['run']}: {result['prompts']} prompts x {result['length']} characters, temperature 0")
    head = ["end in a loop", "median period", "loop from char", "words", "in book (first, last)", "  s"]
    print(f"  {'setting':<28}" + "".join(f"{h:>{len(h) + 2}}" for h in head))
    for row in result["rows"]:
        share = f"{row['looping']}/{row['samples']} ({row['looping'] / row['samples']:.0%})"
        period, start = row["median_period"], row["median_loop_start"]
        book = f"{row['book_words_first']:.0%}, {row['book_words_last']:.0%}"
        print(
            f"  {row['setting']:<28}{share:>15}{'-' if period is None else f'{period:g}':>15}"
            f"{'-' if start is None else f'{start:g}':>16}{row['distinct_words']:>7}{book:>23}{row['seconds']:>5}"
        )
    for row in result["rows"]:
        print(f"\n  {row['setting']}, the first sample's last 300 characters:\n  {row['example']!r}")


if __name__ == "__main__":
    main()
