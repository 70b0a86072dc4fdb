"""The start state prompts are read from (issue 57, part 3): a real state among the paragraph starts, saved with
its weights' checksum and computed again when stale or damaged, used by the sampler, the engine and exports, and
never by scoring."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import wait_until

from textgen import api
from textgen.artifact import INFO_FILE, START_FILE, write_manifest
from textgen.checkpoint import Run
from textgen.config import Split, Weights
from textgen.genconfig import SampleConfig
from textgen.generation import Start
from textgen.startstate import (
    candidate_states,
    compute_start,
    load_start,
    nearest_to_mean,
    paragraph_starts,
    save_start,
    start_path,
    train_ids,
    weights_checksum,
)
from textgen.vocab import Vocabulary

SETTINGS = SampleConfig(length=40, temperature=0.8, seed=3)


@pytest.fixture(scope="module")
def run(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trained_run.copy_to(tmp_path_factory.mktemp("start") / "checkpoints", "tiny")


@pytest.fixture(scope="module")
def generator(run: Run):
    from textgen.sampling import Generator

    return Generator.from_run(run)


def fresh_copy(run: Run, tmp_path: Path) -> Run:
    shutil.copytree(run.path, tmp_path / "checkpoints" / run.name)
    copy = Run(tmp_path / "checkpoints" / run.name)
    start_path(copy, Weights.best).unlink(missing_ok=True)
    return copy


def test_paragraph_starts_follow_blank_lines_else_line_starts() -> None:
    vocab = Vocabulary(tuple("\nab"))
    text = "ab\n" * 100 + "\n".join("ab\n\nba" for _ in range(40))
    ids = vocab.encode(text)
    starts = paragraph_starts(ids, vocab, count=16, context=8)
    assert len(starts) == 16
    assert all(text[s - 2 : s] == "\n\n" and text[s] != "\n" and s >= 8 for s in starts)
    lines = paragraph_starts(vocab.encode("ab\n" * 100), vocab, count=16, context=8)
    assert len(lines) == 16 and all(text[s - 1] == "\n" for s in lines)


def test_the_start_is_the_real_candidate_nearest_their_mean(run: Run, generator) -> None:
    ids = train_ids(run, None)
    logits, candidates = candidate_states(generator, ids)
    assert candidates[0].shape[0] > 1 and logits.shape == (candidates[0].shape[0], generator.vocab.size)
    row = nearest_to_mean(candidates)
    flat = np.concatenate(candidates, axis=1)
    distances = np.linalg.norm(flat - flat.mean(axis=0), axis=1)
    assert distances[row] == distances.min()
    for start, candidate in zip(generator.start.states, candidates, strict=True):
        np.testing.assert_array_equal(start[0], candidate[row])  # a real state, not the mean
    np.testing.assert_array_equal(generator.start.logits[0], logits[row])  # and the logits there
    assert np.abs(generator.start.states[0]).max() > 0


def test_it_is_saved_with_the_weights_checksum_and_read_back(run: Run, generator, monkeypatch) -> None:
    from textgen import startstate
    from textgen.sampling import Generator

    saved, checksum = load_start(start_path(run, Weights.best), 1, generator.cfg.units, generator.cfg.vocab_size)
    assert checksum == weights_checksum(run, Weights.best)
    for array, used in zip(saved.states, generator.start.states, strict=True):
        np.testing.assert_array_equal(array, used)
    np.testing.assert_array_equal(saved.logits, generator.start.logits)

    def not_again(*args):
        raise AssertionError("computed again, though saved")

    monkeypatch.setattr(startstate, "compute_start", not_again)
    again = Generator.from_run(run)
    for array, used in zip(saved.states, again.start.states, strict=True):
        np.testing.assert_array_equal(array, used)


@pytest.mark.parametrize("damage", ["stale", "garbage", "empty", "other shape", "no logits", "other logits"])
def test_a_stale_or_damaged_file_is_computed_again_and_rewritten(
    damage: str, run: Run, generator, tmp_path: Path
) -> None:
    from textgen.sampling import Generator

    copy = fresh_copy(run, tmp_path)
    path = start_path(copy, Weights.best)
    units, vocab_size, checksum = generator.cfg.units, generator.cfg.vocab_size, weights_checksum(copy, Weights.best)
    ones = tuple(np.ones([1, units], np.float32) for _ in range(2))
    if damage == "stale":
        save_start(path, Start(ones, np.ones([1, vocab_size], np.float32)), "0" * 64)
    elif damage == "other shape":
        save_start(path, Start(tuple(np.ones([1, units + 1], np.float32) for _ in range(2))), checksum)
    elif damage == "no logits":  # a file from before they were kept
        save_start(path, Start(ones), checksum)
    elif damage == "other logits":
        save_start(path, Start(ones, np.ones([1, vocab_size + 1], np.float32)), checksum)
    else:
        path.write_bytes(b"" if damage == "empty" else b"PK\x03\x04 not a zip")
    again = Generator.from_run(copy)
    for want, got in zip(generator.start.states, again.start.states, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(again.start.logits, generator.start.logits, atol=1e-5)
    rewritten, saved_for = load_start(path, 1, units, vocab_size)
    assert saved_for == checksum and rewritten.logits is not None


def test_the_last_weights_have_their_own(run: Run, tmp_path: Path) -> None:
    copy = fresh_copy(run, tmp_path)
    api.open_generator(checkpoint_dir=copy.path.parent, run_name=copy.name, weights=Weights.last)
    assert start_path(copy, Weights.last).is_file() and not start_path(copy, Weights.best).exists()


def test_a_read_only_run_directory_computes_it_without_saving(
    run: Run, generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from textgen import files
    from textgen.sampling import Generator

    copy = fresh_copy(run, tmp_path)
    copy.path.chmod(0o555)
    try:
        if os.geteuid() == 0:  # root writes anyway: refuse the write as the filesystem would
            real = files.os.open

            def refused(path, flags, *args):
                if Path(path).parent == copy.path and flags & os.O_CREAT:
                    raise PermissionError(13, "Permission denied", str(path))
                return real(path, flags, *args)

            monkeypatch.setattr(files.os, "open", refused)
        again = Generator.from_run(copy)
    finally:
        copy.path.chmod(0o755)
    for want, got in zip(generator.start.states, again.start.states, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert not start_path(copy, Weights.best).exists()
    assert sorted(p.name for p in copy.path.iterdir()) == sorted(
        p.name for p in run.path.iterdir() if "start" not in p.name
    )


def test_without_its_corpus_a_run_samples_from_zeros(run: Run, tmp_path: Path) -> None:
    from textgen.sampling import Generator

    copy = fresh_copy(run, tmp_path)
    config = json.loads((copy.path / "config.json").read_text())
    config["data"]["files"] = [str(tmp_path / "gone.txt")]
    (copy.path / "config.json").write_text(json.dumps(config))
    assert Generator.from_run(copy).start is None


def test_a_saved_start_from_before_its_logits_is_kept_when_it_cannot_be_computed(
    run: Run, generator, tmp_path: Path
) -> None:
    from textgen.sampling import Generator

    copy = fresh_copy(run, tmp_path)
    save_start(start_path(copy, Weights.best), Start(generator.start.states), weights_checksum(copy, Weights.best))
    config = json.loads((copy.path / "config.json").read_text())
    config["data"]["files"] = [str(tmp_path / "gone.txt")]  # the corpus gone: nothing to compute it again from
    (copy.path / "config.json").write_text(json.dumps(config))
    again = Generator.from_run(copy)
    assert again.start is not None and again.start.logits is None  # its state, not zeros; an empty prompt reads "\n"
    for want, got in zip(generator.start.states, again.start.states, strict=True):
        np.testing.assert_array_equal(got, want)


def test_sampling_reads_prompts_from_the_start_state(run: Run, generator) -> None:
    sampler, _ = api.open_generator(checkpoint_dir=run.path.parent, run_name=run.name)
    prompt = sampler.encode_prompts(["t"])[0]
    logits, _ = sampler.read(prompt[None, :], generator.start.states)
    fed = sampler.feed([prompt])
    np.testing.assert_allclose(fed.logits, logits, atol=1e-6)
    zero_logits, _ = sampler.read(prompt[None, :], sampler.zero_states(1))
    assert not np.allclose(fed.logits, zero_logits, atol=1e-3)
    texts = sampler.generate(["t", "a"], SETTINGS)
    sampler.start = None
    assert sampler.generate(["t", "a"], SETTINGS) != texts


def test_the_engine_starts_each_row_from_the_start_state(generator) -> None:
    from textgen.engine import Engine
    from textgen.rowtable import Job

    engine = Engine(generator, slots=4, max_queue=4)
    engine.start()
    try:
        done, texts = [], {}

        def listen(event) -> None:
            texts[event.index] = texts.get(event.index, "") + event.text
            if event.finish is not None:
                done.append(event.index)

        engine.submit(Job(("t", "a", ""), max_chars=40, temperature=0.8, seed=3), listen)
        wait_until(lambda: len(done) == 3, "the three continuations ended", 60)
    finally:
        engine.close()
    # Each prompt's one continuation draws as textgen sample's first row would; the empty one from the start's logits.
    assert [texts[0], texts[1], texts[2]] == [generator.generate([p], SETTINGS)[0] for p in ("t", "a", "")]


@pytest.mark.parametrize("format", ["litert", "savedmodel"])
def test_an_export_carries_the_start_state_and_samples_as_its_run(
    format: str, run: Run, generator, tmp_path: Path
) -> None:
    copy = fresh_copy(run, tmp_path)
    result = api.export(checkpoint_dir=copy.path.parent, run_name=copy.name, format=format, path=tmp_path / "export")
    assert json.loads((result.path / INFO_FILE).read_text())["textgen_artifact"] == 3
    sampler, _ = api.open_generator(model=result.path)
    for want, got in zip(generator.start.states, sampler.start.states, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sampler.start.logits, generator.start.logits)
    assert sampler.generate(["t", "a", ""], SETTINGS) == generator.generate(["t", "a", ""], SETTINGS)


@pytest.fixture(scope="module")
def litert_export(run: Run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    scratch = tmp_path_factory.mktemp("export")
    copy = fresh_copy(run, scratch)
    return api.export(checkpoint_dir=copy.path.parent, run_name=copy.name, format="litert", path=scratch / "e").path


def test_an_export_from_before_the_start_state_reads_from_zeros(litert_export: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(litert_export, tmp_path / "e"))
    (path / START_FILE).unlink()
    info = json.loads((path / INFO_FILE).read_text())
    (path / INFO_FILE).write_text(json.dumps({**info, "textgen_artifact": 2}))
    (path / "manifest.json").unlink()
    write_manifest(path)
    sampler, _ = api.open_generator(model=path)
    assert sampler.start is None
    assert sampler.generate(["t"], SETTINGS)[0]


def test_a_version_3_export_without_its_start_file_is_refused(litert_export: Path, tmp_path: Path) -> None:
    from textgen.errors import ConfigError

    path = Path(shutil.copytree(litert_export, tmp_path / "e"))
    (path / START_FILE).unlink()
    (path / "manifest.json").unlink()
    write_manifest(path)
    with pytest.raises(ConfigError, match=r"start\.npz"):
        api.open_generator(model=path)


def test_scoring_still_starts_from_zeros(run: Run, generator, tmp_path: Path) -> None:
    copy = fresh_copy(run, tmp_path)
    before = api.evaluate(checkpoint_dir=copy.path.parent, run_name=copy.name, split=Split.test)
    api.open_generator(checkpoint_dir=copy.path.parent, run_name=copy.name)
    assert start_path(copy, Weights.best).is_file()
    after = api.evaluate(checkpoint_dir=copy.path.parent, run_name=copy.name, split=Split.test)
    assert after.nats_per_char == before.nats_per_char
    from textgen.layout import StreamLayout

    ids = train_ids(copy, None)[:600]
    layout = StreamLayout.covering(len(ids), 2, 32)
    with_start = generator.score(ids, layout)
    start, generator.start = generator.start, None
    try:
        assert generator.score(ids, layout) == with_start
    finally:
        generator.start = start


def test_compute_start_is_one_row_per_array(generator, run: Run) -> None:
    start = compute_start(generator, train_ids(run, None))
    assert [s.shape for s in start.states] == [(1, generator.cfg.units)] * 2
    assert start.logits is not None and start.logits.shape == (1, generator.vocab.size)
    assert all(s.dtype == np.float32 for s in (*start.states, start.logits))
