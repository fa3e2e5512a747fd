"""What the DataLoader workers of tests/adapters/test_torch_spawn.py import: a worker started
with "spawn" unpickles its dataset, importing the module of each class and function in it.

``NamedFiles`` is the usual map-style torch dataset (file names held, each file read in
``__getitem__``); its ``recorder`` is fingerprinted by a registered form that appends the
process id to a log file, so the test sees which processes fingerprinted the dataset: the
form is registered here, at import, in every process that unpickles the dataset.
"""

from __future__ import annotations

import os

import torch

import snapcache as sc


class Recorder:
    """Where each process that fingerprints the dataset holding it says so."""

    def __init__(self, log: str) -> None:
        self.log = log


def _fingerprinted(recorder: Recorder) -> str:
    with open(recorder.log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return "recorder"  # what it counts: nothing (the log's path is the test's bookkeeping)


sc.fingerprint.register(Recorder, _fingerprinted)


def fingerprinted(log) -> list[int]:
    """The processes that fingerprinted a dataset recording to ``log``, once a line each time."""
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [int(line) for line in f.read().split()]


class NamedFiles(torch.utils.data.Dataset):
    def __init__(self, paths: list[str], log: str) -> None:
        self.paths = list(paths)
        self.recorder = Recorder(log)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        with open(self.paths[i]) as f:
            return {"id": i, "value": int(f.read())}


def doubled(example: dict) -> dict:
    return {**example, "value": example["value"] * 2}
