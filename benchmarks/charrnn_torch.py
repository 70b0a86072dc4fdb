"""The PyTorch char-rnn recipe on War and Peace, measured the way benchmarks/quality.py measures textgen's recipes.

    pip install torch   # for this benchmark only; textgen does not depend on it
    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/charrnn_torch.py --time-budget 10m 20m 30m 60m

The recipe the issues compare against: Embedding(V, 64) -> torch.nn.LSTM(64, 512) -> Linear(512, V), no dropout,
Adam 2e-3 halved every 5 epochs, gradients clipped at norm 5, batch 64 x 100 on stateful streams (the state carried
from batch to batch and reset each epoch), threads set to the core count. It trains on textgen's training split,
for each wall-clock budget from scratch, keeps the weights of its best validation epoch (validation after every
epoch, and at the budget's end), and scores them on the test split read as ``textgen evaluate`` reads it (64
contiguous streams of 100-character batches, the state carried throughout). With several budgets it prints the
frontier table of benchmarks/quality.py, so the two tables line up.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time

import numpy as np
from common import REF, reference_splits
from quality import frontier

from textgen.config import parse_duration
from textgen.data import StreamLayout

HALVE_EVERY = 5  # epochs


def train_and_score(budget: float, seed: int = 0) -> dict:
    """Train the char-rnn recipe for ``budget`` seconds; its best validation epoch's test nats/char."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(os.cpu_count() or 1)
    _, splits = reference_splits()
    vocab, batch, seq = splits.vocab.size, REF["batch_size"], REF["seq_len"]

    class CharRNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(vocab, REF["embedding_dim"])
            self.lstm = torch.nn.LSTM(REF["embedding_dim"], REF["units"], batch_first=True)
            self.logits = torch.nn.Linear(REF["units"], vocab)

        def forward(self, x: torch.Tensor, state: tuple | None) -> tuple[torch.Tensor, tuple]:
            out, state = self.lstm(self.embedding(x), state)
            return self.logits(out), state

    def batches(ids: np.ndarray, streams: int) -> tuple[StreamLayout, list]:
        layout = StreamLayout.of(len(ids), streams, seq)
        return layout, [layout.batch(ids, k) for k in range(layout.batches)]

    def score(model: CharRNN, ids: np.ndarray) -> float:
        """Mean cross-entropy (nats/char) of ``ids`` as 64 contiguous streams, state carried throughout."""
        _, parts = batches(ids, 64)
        total, chars, state = 0.0, 0, None
        with torch.no_grad():
            for x, y in parts:
                logits, state = model(torch.from_numpy(x.astype(np.int64)), state)
                target = torch.from_numpy(y.astype(np.int64)).reshape(-1)
                total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), target, reduction="sum"))
                chars += target.numel()
        return total / chars

    model = CharRNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=HALVE_EVERY, gamma=0.5)
    layout, train = batches(splits.train, batch)
    started, trained, training_seconds, best = time.monotonic(), 0, 0.0, (math.inf, None)
    while time.monotonic() - started < budget:
        state, done, epoch_started = None, 0, time.monotonic()
        for x, y in train:
            optimizer.zero_grad()
            logits, state = model(torch.from_numpy(x.astype(np.int64)), state)
            target = torch.from_numpy(y.astype(np.int64)).reshape(-1)
            torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), target).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            state = tuple(s.detach() for s in state)
            done += 1
            if time.monotonic() - started >= budget:
                break
        trained, training_seconds = trained + done, training_seconds + time.monotonic() - epoch_started
        schedule.step()
        val = score(model, splits.val)
        if val < best[0]:
            best = (val, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[1])
    return {
        "recipe": "PyTorch char-rnn",
        "time_budget": f"{budget:g}s",
        "epochs": round(trained / layout.batches, 1),
        "chars_per_sec": trained * layout.chars_per_batch / training_seconds,  # validation excluded, as quality.py's
        "best_val_nats_per_char": best[0],
        "test_nats_per_char": score(model, splits.test),
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-budget", nargs="+", default=["10m"], help="training wall-clock budgets")
    parser.add_argument("--json", action="store_true", help="print one JSON object per budget")
    args = parser.parse_args()
    reports = []
    for budget in args.time_budget:
        report = train_and_score(parse_duration(budget))
        report["time_budget"] = budget
        reports.append(report)
        print(json.dumps(report), flush=True)
    if not args.json and len(reports) > 1:
        print(f"\nfrontier of the PyTorch char-rnn recipe on this host:\n{frontier(reports)}")


if __name__ == "__main__":
    main()
