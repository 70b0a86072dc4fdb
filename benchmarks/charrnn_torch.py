"""The PyTorch char-rnn recipe on War and Peace, measured the way benchmarks/quality.py measures textgen's recipes.

    pip install torch==2.13.0   # for this benchmark only; textgen does not depend on it
    # (these machines hold its CPU build; elsewhere add --index-url https://download.pytorch.org/whl/cpu)
    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/charrnn_torch.py --time-budget 10m 20m 30m 60m

The recipe the issues compare against: Embedding(V, 64) -> torch.nn.LSTM(64, 512) -> Linear(512, V), no dropout,
Adam 2e-3 halved every 5 epochs, gradients clipped at norm 5, batch 64 x 100 on stateful streams (the state carried
from batch to batch and reset each epoch), threads set to the core count. It trains on textgen's training split once,
for the longest budget: the recipe's schedule does not depend on the budget, so each shorter budget is the same run
stopped there (its reporting kept off the clock). At each budget it keeps the weights of the best validation so far
(after every epoch, and at the budget's end) and scores them on the test split read as ``textgen evaluate`` reads it
(64 contiguous streams of 100-character batches, the state carried throughout). With several budgets it prints the
frontier table of benchmarks/quality.py, so the two tables line up.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from common import REF, reference_splits
from quality import frontier

from textgen.durations import parse_duration
from textgen.layout import StreamLayout

if TYPE_CHECKING:
    import torch

    State = tuple[torch.Tensor, torch.Tensor]  # the LSTM's (h, c), carried from batch to batch

HALVE_EVERY = 5  # epochs


def recipe(vocab: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The recipe's model and optimizer: Embedding(vocab, 64) -> torch.nn.LSTM(64, 512) x REF["layers"] ->
    Linear(512, vocab), called as ``model(x, state) -> (logits, state)`` and initialised from torch's generator as
    it stands (seed it first); Adam at 2e-3. benchmarks/train_throughput.py times this model and ``train_step``.
    """
    import torch

    class CharRNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(vocab, REF["embedding_dim"])
            self.lstm = torch.nn.LSTM(REF["embedding_dim"], REF["units"], REF["layers"], batch_first=True)
            self.logits = torch.nn.Linear(REF["units"], vocab)

        def forward(self, x: torch.Tensor, state: State | None) -> tuple[torch.Tensor, State]:
            out, state = self.lstm(self.embedding(x), state)
            return self.logits(out), state

    model = CharRNN()
    return model, torch.optim.Adam(model.parameters(), lr=2e-3)


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: np.ndarray, y: np.ndarray, state: State | None
) -> tuple[torch.Tensor, State]:
    """One step of the recipe on the ids ``x`` and their targets ``y``: the mean cross-entropy, its gradients
    clipped at norm 5, the optimizer's step. Returns the loss and the state to carry on, detached."""
    import torch

    optimizer.zero_grad()
    logits, state = model(torch.from_numpy(x.astype(np.int64)), state)
    target = torch.from_numpy(y.astype(np.int64)).reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    optimizer.step()
    return loss, (state[0].detach(), state[1].detach())


def train_and_score(budgets: list[float], seed: int = 0) -> Iterator[dict[str, Any]]:
    """Train the char-rnn recipe once, for the longest budget; at each budget the report a run of that budget gives.

    The recipe halves its rate by epochs, whatever the budget, so a run of 30 minutes is the first 30 minutes of a
    run of 60: each budget's end stops the clock, validates where a run of that length would (at its end, beside
    the epoch ends so far), scores those best weights on test, and restarts the clock. One 60-minute run gives the
    10-, 20-, 30- and 60-minute results, which take two hours as separate runs.
    """
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(os.cpu_count() or 1)
    _, splits = reference_splits()
    vocab, batch, seq = splits.vocab.size, REF["batch_size"], REF["seq_len"]

    def batches(ids: np.ndarray, streams: int) -> tuple[StreamLayout, list[tuple[np.ndarray, np.ndarray]]]:
        layout = StreamLayout.of(len(ids), streams, seq)
        return layout, [layout.batch(ids, k) for k in range(layout.batches)]

    def score(model: torch.nn.Module, ids: np.ndarray) -> float:
        """Mean cross-entropy (nats/char) of ``ids`` as 64 contiguous streams, state carried throughout."""
        _, parts = batches(ids, 64)
        total, chars = 0.0, 0
        state: State | None = None
        with torch.no_grad():
            for x, y in parts:
                logits, state = model(torch.from_numpy(x.astype(np.int64)), state)
                target = torch.from_numpy(y.astype(np.int64)).reshape(-1)
                total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), target, reduction="sum"))
                chars += target.numel()
        return total / chars

    model, optimizer = recipe(vocab)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=HALVE_EVERY, gamma=0.5)
    layout, train = batches(splits.train, batch)
    started, off_clock, validating = time.monotonic(), 0.0, 0.0
    trained, position = 0, 0
    state: State | None = None
    best: tuple[float, dict[str, torch.Tensor] | None] = (math.inf, None)
    pending = sorted(budgets)

    def elapsed() -> float:
        return time.monotonic() - started - off_clock

    def validate() -> float:
        nonlocal validating
        began = time.monotonic()
        loss = score(model, splits.val)
        validating += time.monotonic() - began
        return loss

    while pending:
        _, state = train_step(model, optimizer, *train[position], state)
        trained, position = trained + 1, position + 1
        if position == layout.batches:  # the epoch's end: the schedule, a validation, the state reset
            schedule.step()
            loss = validate()
            if loss < best[0]:
                best = (loss, copy.deepcopy(model.state_dict()))
            position, state = 0, None
        while pending and elapsed() >= pending[0]:
            paused, budget = time.monotonic(), pending.pop(0)
            training_seconds = elapsed() - validating
            # A run of this length ends mid-epoch with one more validation (off this run's clock: not validate()).
            final = (score(model, splits.val), model.state_dict()) if position else best
            val, weights = min(best, final, key=lambda b: b[0])
            scored = copy.deepcopy(model)
            scored.load_state_dict(weights)
            report = {
                "recipe": "PyTorch char-rnn",
                "time_budget": f"{budget:g}s",
                "epochs": round(trained / layout.batches, 1),
                "chars_per_sec": trained * layout.chars_per_batch / training_seconds,  # validation excluded
                "best_val_nats_per_char": val,
                "test_nats_per_char": score(scored, splits.test),
                "torch": torch.__version__,
            }
            yield report
            off_clock += time.monotonic() - paused  # the caller's printing too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-budget", nargs="+", default=["10m"], help="training wall-clock budgets")
    parser.add_argument("--json", action="store_true", help="print one JSON object per budget")
    args = parser.parse_args()
    budgets = [parse_duration(b) for b in args.time_budget]
    reports = []
    for budget, report in zip(sorted(args.time_budget, key=parse_duration), train_and_score(budgets), strict=True):
        report["time_budget"] = budget
        reports.append(report)
        print(json.dumps(report), flush=True)  # as each budget is reached: a stopped run keeps the shorter ones
    if not args.json and len(reports) > 1:
        print(f"\nfrontier of the PyTorch char-rnn recipe on this host:\n{frontier(reports)}")


if __name__ == "__main__":
    main()
