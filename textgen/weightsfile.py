"""A weights file (Keras' ``.weights.h5``) saved with a SHA-256 of its arrays, and checked against it: HDF5 checks
only its own structure, so a flipped bit in the weights would otherwise load."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import keras

WEIGHTS_DIGEST = "textgen_sha256"  # the attribute of a weights file that holds its arrays' checksum


def save_weights(model: keras.Model, path: Path, **attrs: Any) -> None:
    """Save the model's variables only (Keras' ``save_weights`` adds the attached optimizer's, Adam's moments twice
    the model, which the resume point keeps in its own file), with ``attrs`` and the arrays' checksum."""
    import h5py
    import keras

    keras.saving.save_weights(model, path, objects_to_skip=[getattr(model, "optimizer", None)])
    with h5py.File(path, "a") as fh:
        fh.attrs.update({**attrs, WEIGHTS_DIGEST: _digest(fh)})


def read_checksums(path: Path) -> tuple[str | None, str]:
    """The checksum saved with a weights file's arrays (None in a file from before it was saved), and theirs now."""
    import h5py

    with h5py.File(path, "r") as fh:
        saved = fh.attrs.get(WEIGHTS_DIGEST)
        return None if saved is None else str(saved), _digest(fh)


def weights_checksum(path: Path) -> str:
    """The checksum of a weights file's arrays: the one saved with them (computed, for a file from before)."""
    import h5py

    with h5py.File(path, "r") as fh:
        return str(fh.attrs.get(WEIGHTS_DIGEST) or _digest(fh))


def weights_intact(path: Path) -> bool:
    """Whether a weights file's arrays match the checksum saved with them (files from before it was saved have
    none: they are taken as they are)."""
    saved, actual = read_checksums(path)
    return saved is None or saved == actual


def _digest(fh: Any) -> str:
    """A SHA-256 of every array in an open weights file, by name."""
    import h5py

    digest = hashlib.sha256()

    def add(name: str, item: Any) -> None:
        if isinstance(item, h5py.Dataset):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(item[()]).tobytes())

    fh.visititems(add)
    return digest.hexdigest()
