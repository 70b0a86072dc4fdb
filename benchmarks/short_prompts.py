"""Garbage after a short prompt (issue 57, part 3): how often a sample starts with characters the book hardly has.

For each ``--run`` (a run directory), the 26 capital letters A-Z are each given as a prompt, ``--seeds`` times,
at temperature 0.8; so are 26 prompts of 20 characters cut from the run's training split at random word starts.
A sample counts as garbage when its first ``--chars`` (60) generated characters hold a character seen fewer than
once in 100,000 in the training split (accented capitals, digits and symbols in War and Peace). Each share is
printed for prompts read from the all-zero state and from the run's start state (``textgen.startstate``), side
by side. The target: with the start state, the one-letter share no higher than the 20-character one.

    PYTHONPATH=. python benchmarks/short_prompts.py --run checkpoints/2600-0 --seeds 4
    PYTHONPATH=. python benchmarks/short_prompts.py --run a --run b --start saved --json
    PYTHONPATH=. python benchmarks/short_prompts.py --run checkpoints/2600-0 --seeds 20 --ablate   # which state
    PYTHONPATH=. python benchmarks/short_prompts.py --no-prompt base:en --seeds 100

``--no-prompt MODEL`` (a run directory, an export, or ``base:en``) samples with no prompt at all instead, ``--seeds``
samples, and counts those whose first line is a heading (``CHAPTER``, ``BOOK``, ``PART`` or a line of capitals):
started from the start state's own logits, as textgen samples, against reading a newline there first, as it did
before the start kept its logits.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import string
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from textgen.generation import Sampler
    from textgen.vocab import Vocabulary

RARE = 1e-5  # a character seen fewer than once in 100,000 is garbage at a sample's start
PROMPT_CHARS = 20


def rare_ids(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """The ids (bool mask by id) seen fewer than ``RARE`` of the time in ``ids``; the unknown id too."""
    counts = np.bincount(np.asarray(ids, np.int64), minlength=vocab_size)
    rare = counts < RARE * len(ids)
    rare[0] = True
    return rare


def text_prompts(ids: np.ndarray, vocab: Vocabulary, count: int, rng: np.random.Generator) -> list[str]:
    """``count`` prompts of ``PROMPT_CHARS`` characters of ``ids``, each starting at a random word start."""
    space, newline = (int(vocab.encode(c)[0]) for c in " \n")
    starts = np.flatnonzero(np.isin(ids[:-PROMPT_CHARS], [space, newline])) + 1
    starts = starts[(ids[starts] != space) & (ids[starts] != newline)]
    return [vocab.decode(ids[s : s + PROMPT_CHARS]) for s in rng.choice(starts, count, replace=False)]


def garbage(
    sampler: Sampler, prompts: list[str], seeds: int, chars: int, rare: np.ndarray
) -> tuple[int, int, str | None]:
    """How many of ``prompts`` x ``seeds`` samples hold a rare character in their first ``chars``; of how many;
    the first such sample."""
    from textgen.genconfig import SampleConfig

    bad, example = 0, None
    for seed in range(seeds):
        for prompt, text in zip(
            prompts, sampler.generate(prompts, SampleConfig(length=chars, temperature=0.8, seed=seed)), strict=True
        ):
            if rare[sampler.vocab.encode(text)].any():
                bad += 1
                example = example or prompt + text
    return bad, len(prompts) * seeds, example


def ablate(run_dir: Path, seeds: int, chars: int, weights: str) -> dict[str, tuple[int, int]]:
    """One-letter prompts' garbage from other starts than the saved one: a blank line read from zeros before the
    letter, three single paragraph-start candidates, and the candidates' mean itself."""
    from textgen import api
    from textgen.checkpoint import Run
    from textgen.config import Weights
    from textgen.generation import Start
    from textgen.startstate import candidate_states, train_ids

    sampler, _ = api.open_generator(checkpoint_dir=run_dir.parent, run_name=run_dir.name, weights=Weights(weights))
    ids = train_ids(Run(run_dir), None, limit=None)
    if ids is None:
        raise SystemExit(f"{run_dir}: its corpus is gone or changed; the benchmark needs its training split")
    rare, letters = rare_ids(ids, sampler.vocab.size), list(string.ascii_uppercase)
    saved, (_, candidates) = sampler.start, candidate_states(sampler, ids)  # it searches the first SEARCHED itself
    starts: dict[str, Start | None] = {
        f"candidate {row}": Start(tuple(c[row : row + 1] for c in candidates)) for row in (0, 17, 40)
    }
    starts["the candidates' mean"] = Start(tuple(c.mean(axis=0, keepdims=True) for c in candidates))
    starts["saved (the candidate nearest the mean)"] = saved
    sampler.start = None
    result = {"zeros, a blank line before": garbage(sampler, ["\n\n" + c for c in letters], seeds, chars, rare)[:2]}
    for name, start in starts.items():
        sampler.start = start
        result[name] = garbage(sampler, letters, seeds, chars, rare)[:2]
    return result


def measure(run_dir: Path, seeds: int, chars: int, starts: list[str], weights: str) -> dict:
    from textgen import api
    from textgen.checkpoint import Run
    from textgen.config import Weights
    from textgen.startstate import train_ids

    began = time.monotonic()
    sampler, _ = api.open_generator(checkpoint_dir=run_dir.parent, run_name=run_dir.name, weights=Weights(weights))
    opened = time.monotonic() - began
    ids = train_ids(Run(run_dir), None, limit=None)
    if ids is None:
        raise SystemExit(f"{run_dir}: its corpus is gone or changed; the benchmark needs its training split")
    rare = rare_ids(ids, sampler.vocab.size)
    prompts = {
        "1 letter": [c for c in string.ascii_uppercase if sampler.vocab.encode(c)[0] != 0],
        f"{PROMPT_CHARS} chars": text_prompts(ids, sampler.vocab, 26, np.random.default_rng(0)),
    }
    saved, result = sampler.start, {"run": str(run_dir), "weights": weights, "open_seconds": round(opened, 2)}
    result["rare_chars"] = "".join(sampler.vocab.decode(np.flatnonzero(rare[1:]) + 1))
    for start in starts:
        sampler.start = None if start == "zeros" else saved
        if start == "saved" and saved is None:
            raise SystemExit(f"{run_dir}: no start state (its corpus is gone?)")
        for kind, given in prompts.items():
            bad, total, example = garbage(sampler, given, seeds, chars, rare)
            result[f"{kind}, {start}"] = {"garbage": bad, "samples": total, "example": example}
    return result


HEADING = re.compile(r"CHAPTER|BOOK|PART|^[A-Z0-9 .,'-]{4,}$")


def no_prompt(model: str, samples: int, chars: int) -> dict[str, int]:
    """How many of ``samples`` unprompted samples of ``model`` begin with a heading line, and with a newline, from the
    start state's logits and after reading a newline at the start state."""
    from textgen import api
    from textgen.basemodel import names_base
    from textgen.genconfig import SampleConfig

    path = Path(model)
    if names_base(model) or not (path / "config.json").is_file():
        sampler, _ = api.open_generator(model=path)
    else:
        sampler, _ = api.open_generator(checkpoint_dir=path.parent, run_name=path.name)
    if sampler.start is None or sampler.start.logits is None:
        raise SystemExit(f"{model} has no start state with its logits: export it, or sample the run, again")
    result = {}
    for name, start in (("from the start's logits", sampler.start), ("a newline read first", None)):
        sampler.start = start or dataclasses.replace(sampler.start, logits=None)
        texts = sampler.generate([""] * samples, SampleConfig(length=chars, temperature=0.8, seed=1, num=samples))
        result[f"{name}: a heading"] = sum(bool(HEADING.search(t.strip("\n").split("\n")[0])) for t in texts)
        result[f"{name}: a newline"] = sum(t.startswith("\n") for t in texts)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", default=[], type=Path, help="a run directory (repeatable)")
    parser.add_argument("--no-prompt", metavar="MODEL", help="unprompted samples of a run, an export or base:en")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--chars", type=int, default=60, help="generated characters checked per sample")
    parser.add_argument("--start", choices=["zeros", "saved", "both"], default="both")
    parser.add_argument("--weights", choices=["best", "last"], default="best")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ablate", action="store_true", help="one-letter prompts from other start states instead")
    args = parser.parse_args()
    if args.no_prompt:
        for name, count in no_prompt(args.no_prompt, args.seeds, args.chars).items():
            print(f"{args.no_prompt}  no prompt, {name}: {count}/{args.seeds}")
        return
    if not args.run:
        parser.error("give --run (or --no-prompt)")
    if args.ablate:
        for run_dir in args.run:
            for name, (bad, total) in ablate(run_dir, args.seeds, args.chars, args.weights).items():
                print(f"{run_dir}  1 letter, {name}: {bad}/{total}")
        return
    starts = ["zeros", "saved"] if args.start == "both" else [args.start]
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {args.seeds} seeds, temperature 0.8")
    for run_dir in args.run:
        result = measure(run_dir, args.seeds, args.chars, starts, args.weights)
        if args.json:
            print(json.dumps(result, ensure_ascii=False))
            continue
        print(f"\n{run_dir} ({args.weights} weights; rare: {result['rare_chars']!r})")
        print(f"  {'prompts':<10}" + "".join(f"{'from ' + s:>22}" for s in starts))
        for kind in ("1 letter", f"{PROMPT_CHARS} chars"):
            cells = [result[f"{kind}, {s}"] for s in starts]
            row = "".join(f"{c['garbage']:>8}/{c['samples']} ({c['garbage'] / c['samples']:6.1%})" for c in cells)
            print(f"  {kind:<10}{row}")
        for key, cell in result.items():
            if isinstance(cell, dict) and cell["example"]:
                print(f"  e.g. {key}: {cell['example']!r}")


if __name__ == "__main__":
    main()
