"""Fuzzing the checkpoint disk tier: whatever is done to its files, a new store over the
folder starts, offers each blob only under the exact token list it was written with, and
removes every file it rejects. No model is needed: blobs are arbitrary bytes."""

from __future__ import annotations

import hashlib
import json
import struct
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.files.strict_json import dumps_strict
from engine.storage.checkpoints import Checkpoint, file_head, valid_bounds
from tests.engine.storage.test_checkpoints import forge, spill, split, tier_files, tier_store

WRITTEN = [
    Checkpoint(tokens=(1, 2, 3), blob=bytes(range(200, 0, -1)), bounds=(3,)),
    Checkpoint(tokens=(1, 2, 4), blob=bytes(range(200)), bounds=(1, 3)),
    Checkpoint(tokens=(9, 8, 7, 6), blob=b"\x07" * 200, bounds=(2, 4), flags=2),
]
BY_TOKENS = {c.tokens: c for c in WRITTEN}
MEMORY_BOUND = 1 << 20  # the files are a few hundred bytes; reading them costs no more

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=8,
)
FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _mutate_json(value: Any, data: st.DataObject) -> Any:
    """`value` with one change somewhere inside it: a value replaced, a key or an item
    removed or added."""
    if isinstance(value, dict) and value and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate_json(value[key], data)}
    if isinstance(value, list) and value and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(value) - 1))
        return [*value[:i], _mutate_json(value[i], data), *value[i + 1:]]
    action = data.draw(st.sampled_from(["replace", "remove", "add"]))
    if action == "remove" and isinstance(value, dict) and value:
        key = data.draw(st.sampled_from(sorted(value)))
        return {k: v for k, v in value.items() if k != key}
    if action == "remove" and isinstance(value, list) and value:
        i = data.draw(st.integers(0, len(value) - 1))
        return value[:i] + value[i + 1:]
    if action == "add" and isinstance(value, dict):
        return {**value, data.draw(st.text(max_size=6)): data.draw(JSON)}
    if action == "add" and isinstance(value, list):
        return [*value, data.draw(JSON)]
    return data.draw(JSON)


def _damage(raw: bytes, pristine: bytes, original: Checkpoint, data: st.DataObject) -> bytes:
    """One change to a tier file's bytes `raw`, as a disk, a crash or someone without the
    key could make it. The changes that need the header start again from the `pristine`
    file, as `original` was written."""
    kind = data.draw(st.sampled_from(
        ["flip", "truncate", "insert", "length", "swap", "header", "huge size"]))
    if kind == "flip":
        at = data.draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]
    if kind == "truncate":
        return raw[:data.draw(st.integers(0, len(raw) - 1))]
    if kind == "insert":
        at = data.draw(st.integers(0, len(raw)))
        return raw[:at] + data.draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    if kind == "length":  # the header's declared length, up to 4 GiB
        return raw[:12] + struct.pack("<I", data.draw(st.integers(0, 2**32 - 1))) + raw[16:]
    head, header, blob = split(pristine)
    if kind == "swap":  # another file's blob, under a header with its checksum recomputed
        other = data.draw(st.sampled_from([c for c in WRITTEN if c is not original]))
        assert other.blob is not None and original.blob is not None
        new_header = header.replace(hashlib.sha256(original.blob).hexdigest().encode(),
                                    hashlib.sha256(other.blob).hexdigest().encode())
        return head + new_header + bytes(other.blob)
    fields = json.loads(header)
    if kind == "huge size":
        fields["size"] = data.draw(st.integers(len(blob) + 1, 2**64))
    else:
        fields = _mutate_json(fields, data)
    new_header = dumps_strict(fields)
    if data.draw(st.booleans()):  # the old tag kept, or a tag made with another key
        return head[:12] + struct.pack("<I", len(new_header)) + head[16:] + new_header + blob
    return file_head(b"someone else's key, 32 bytes ..", new_header) + new_header + blob


@FUZZ
@given(data=st.data())
def test_damaged_tier_files_are_removed_and_only_exact_blobs_are_offered(
    data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        # In the order of WRITTEN (file names hold run-wide ids), so draws are repeatable.
        files = sorted(spill(root, WRITTEN), key=lambda p: WRITTEN.index(_written_as(p)))
        damaged = [files[i] for i in sorted(data.draw(
            st.sets(st.integers(0, len(files) - 1), min_size=1)))]
        for path in damaged:
            raw = pristine = path.read_bytes()
            for _ in range(data.draw(st.integers(1, 3))):
                if len(raw) >= 16:
                    raw = _damage(raw, pristine, _written_as(path), data)
            path.write_bytes(raw)

        tracemalloc.start()
        try:
            store = tier_store(root)  # never raises, whatever the folder holds
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < MEMORY_BOUND

        offered = 0
        for checkpoint in store.all():
            fetched = store.fetch(checkpoint)
            if fetched is None:
                continue
            offered += 1
            written = BY_TOKENS[fetched.tokens]
            assert fetched.blob == written.blob and fetched.bounds == written.bounds
            assert fetched.flags == written.flags
        assert len(store) == offered
        assert store.stats().rejected == len(WRITTEN) - offered
        assert len(tier_files(root)) == offered  # every rejected file is gone
        assert set(files) - set(damaged) <= set(tier_files(root))  # the others are untouched


@FUZZ
@given(data=st.data())
def test_a_signed_header_of_any_shape_never_stops_a_start(data: st.DataObject) -> None:
    """Past the tag, the header is still checked field by field: whatever it holds, the
    store starts, and what it offers is well-formed and the file's own blob."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (path,) = spill(root, WRITTEN[:1])
        _, header, blob = split(path.read_bytes())
        forge(path, dumps_strict(_mutate_json(json.loads(header), data)), blob)
        store = tier_store(root)
        fetched = [store.fetch(c) for c in store.all()]
        if not fetched or fetched[0] is None:
            assert tier_files(root) == [] and store.stats().rejected == 1
            return
        (checkpoint,) = fetched
        assert checkpoint is not None and checkpoint.blob == blob
        assert all(type(t) is int for t in checkpoint.tokens)
        assert valid_bounds(checkpoint.bounds, checkpoint.n_tokens)
        assert type(checkpoint.flags) is int and 0 <= checkpoint.flags < 1 << 32
        assert tier_files(root) == [path]


def _written_as(path: Path) -> Checkpoint:
    """The checkpoint an undamaged tier file holds."""
    return BY_TOKENS[tuple(json.loads(split(path.read_bytes())[1])["tokens"])]
