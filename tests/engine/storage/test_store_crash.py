"""Crash safety, tested like a database: SIGKILL a writer at random moments, many times.

A kill cannot lose what the operating system has cached, so this cannot see a missing fsync;
tests/engine/storage/test_durability.py checks those."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.core.tree import NodeStatus, Role
from engine.storage.store import Store

ROOT = Path(__file__).resolve().parents[3]
TRIALS = 200


@pytest.mark.slow  # a minute: TRIALS writer processes killed at random moments
def test_sigkill_at_random_moments_never_loses_or_half_writes(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    rng = random.Random(1234)
    promised_created: set[tuple[int, int]] = set()
    promised_sent: set[tuple[int, int, int]] = set()
    sent = 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for trial in range(TRIALS):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.crash_writer", str(db), str(trial)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        # Kill at a random moment of the writing, however long the interpreter took to start
        # on a loaded machine.
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.15))
        writer.send_signal(signal.SIGKILL)
        # Not communicate(): it would miss what readline() already buffered past "ready".
        assert writer.stderr is not None
        out, err = writer.stdout.read(), writer.stderr.read()
        writer.wait()
        assert writer.returncode == -signal.SIGKILL, err
        for line in out.splitlines(keepends=True):
            if not line.endswith("\n") or line == "ready\n":
                continue  # cut off mid-line by the kill: the action may or may not be in
            kind, *fields = line.split()
            ids = [int(field) for field in fields]
            if kind == "created":
                promised_created.add((ids[0], ids[1]))
            elif kind == "sent":
                promised_sent.add((ids[0], ids[1], ids[2]))
                sent += 1
            elif kind == "deleting":  # a branch's ids are all its top's or higher
                promised_sent = {p for p in promised_sent if p[0] != ids[0] or p[1] < ids[1]}
            else:  # purging
                promised_created = {p for p in promised_created if p[0] != ids[0]}
                promised_sent = {p for p in promised_sent if p[0] != ids[0]}
        with Store(db) as store:
            # SQLite's integrity check, no dangling foreign key, and the search index
            # holding exactly the messages' text.
            assert store.problems() == [], f"trial {trial}"
            trees = {c.id: store.load(c.id) for c in store.list()}
        for cid, root in promised_created:
            assert cid in trees and trees[cid].root_id == root
        for cid, user, reply in promised_sent:
            tree = trees[cid]
            assert tree.node(reply).text == f"reply to {user}"
            assert tree.node(reply).status is NodeStatus.COMPLETE
        for tree in trees.values():
            for node in tree.nodes():
                # Nothing half-written: every user message has its reply row, and a reply
                # that was cut short reopens as interrupted, never as streaming.
                if node.role is Role.USER:
                    assert node.children, f"trial {trial}: a message without its reply row"
                assert node.status is not NodeStatus.STREAMING
    # The writer did real work before most kills.
    assert sent > TRIALS // 4
