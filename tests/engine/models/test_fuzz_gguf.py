"""GGUF headers are hostile: `read_gguf_header` (and the model picker above it) reads every
file in the models folder, so its work and memory follow the bytes actually read, never the
counts a header claims, and only its typed errors escape."""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.dialogs.model_picker import ModelEntry
from engine.core.errors import ModelLoadError
from engine.models import gguf_header
from engine.models.files import ModelInfo, read_model_info
from engine.models.gguf_header import GGUFHeaderError, read_gguf_header

STRING, ARRAY, UINT8, UINT32 = 8, 9, 0, 4


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def _header(*entries: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries)) + b"".join(entries)


def _u32(name: str, value: int) -> bytes:
    return _key(name) + struct.pack("<II", UINT32, value)


def _array(name: str, item_type: int, count: int, items: bytes) -> bytes:
    return _key(name) + struct.pack("<IIQ", ARRAY, item_type, count) + items


def _write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _peak(action: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_wanted_array_is_skipped_not_built(tmp_path: Path) -> None:
    """A 4 Mi-item array under a key Arbor reads was built item by item (seconds, a list of
    millions of ints). Bound: kept values cost at most MAX_KEPT_ITEMS items."""
    n = 4 << 20
    path = _write(tmp_path, _header(
        _key("general.architecture") + struct.pack("<IQ", STRING, 5) + b"llama",
        _array("general.junk", UINT8, n, b"\x01" * n),
        _u32("llama.context_length", 4096),
    ))
    infos: list[ModelInfo] = []
    peak = _peak(lambda: infos.append(read_model_info(path)))
    assert infos[0].context_length == 4096  # read past the array
    assert peak < 1 << 20


def test_kept_arrays_are_bounded_in_all(tmp_path: Path) -> None:
    """Each array is short, but there are many: what is kept is bounded across the header."""
    entries = [_array(f"general.a{i}", UINT8, 4096, b"\x02" * 4096) for i in range(1000)]
    path = _write(tmp_path, _header(*entries))
    kept: dict[str, object] = {}
    peak = _peak(lambda: kept.update(read_gguf_header(path, lambda key: True)))
    assert sum(len(v) for v in kept.values() if isinstance(v, list)) <= gguf_header.MAX_KEPT_ITEMS
    assert peak < 8 << 20


def test_an_array_count_is_checked_against_the_file_before_any_item(tmp_path: Path) -> None:
    """A skipped string array claiming 2**40 items in a 1 MiB file was walked string by
    string to the end of the file."""
    path = _write(tmp_path, _header(_array("tokenizer.ggml.tokens", STRING, 1 << 40,
                                           b"\0" * (1 << 20))))
    with pytest.raises(GGUFHeaderError, match="does not fit"):
        read_gguf_header(path, lambda key: False)


def test_the_header_is_read_within_a_byte_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_header, "MAX_METADATA_BYTES", 1 << 20)
    long = struct.pack("<Q", 1 << 20) + b"s" * (1 << 20)
    path = _write(tmp_path, _header(
        _array("tokenizer.merges", STRING, 3, long * 3), _u32("general.x", 1)
    ))
    with pytest.raises(GGUFHeaderError, match="larger than 1 MiB"):
        read_gguf_header(path, lambda key: True)


def test_skipped_string_arrays_are_walked_exactly(tmp_path: Path) -> None:
    """Strings of every length, some crossing the reader's blocks, then a value after them."""
    strings = [b"x" * (i * 37 % 5000) for i in range(2000)] + [b"y" * (3 << 20)]
    items = b"".join(struct.pack("<Q", len(s)) + s for s in strings)
    path = _write(tmp_path, _header(
        _array("tokenizer.ggml.tokens", STRING, len(strings), items), _u32("general.after", 7)
    ))
    assert read_gguf_header(path, lambda key: key == "general.after") == {"general.after": 7}
    with pytest.raises(GGUFHeaderError, match="a string of 3145728 bytes"):
        read_gguf_header(path, lambda key: True)  # kept, but one string is over the limit


def test_a_real_header_reads_as_gguf_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(2048)
    writer.add_name("tiny")
    writer.add_chat_template("{{ messages }}")
    writer.add_token_list([f"t{i}" for i in range(5000)])
    writer.add_array("llama.attention.sliding_window", [0, 512, 0, 512])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    info = read_model_info(path)
    assert (info.name, info.context_length, info.sliding_window) == ("tiny", 2048, 512)
    assert info.chat_template == "{{ messages }}"


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A safety net, not a timing assertion: a regression that blocks on a FIFO fails."""

    def fail(signum: int, frame: object) -> None:
        raise TimeoutError("blocked opening a FIFO")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_fifo_is_not_opened_for_reading(tmp_path: Path, no_hang: None) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        read_gguf_header(fifo, lambda key: True)


# --- fuzz --------------------------------------------------------------------------------------

_VALUE_TYPES = [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, STRING, ARRAY, 13, 1 << 31]
_COUNTS = st.one_of(st.integers(0, 64), st.sampled_from([1 << 20, 1 << 32, (1 << 64) - 1]))


@st.composite
def _entries(draw: st.DrawFn) -> bytes:
    name = draw(st.sampled_from(["general.name", "general.architecture", "llama.block_count",
                                 "tokenizer.ggml.tokens", "tokenizer.chat_template", "x"]))
    vtype = draw(st.sampled_from(_VALUE_TYPES))
    if vtype == ARRAY:
        item = draw(st.sampled_from(_VALUE_TYPES))
        body = struct.pack("<IQ", item, draw(_COUNTS)) + draw(st.binary(max_size=64))
    elif vtype == STRING:
        body = struct.pack("<Q", draw(_COUNTS)) + draw(st.binary(max_size=64))
    else:
        body = draw(st.binary(max_size=16))
    return _key(name) + struct.pack("<I", vtype) + body


@st.composite
def _headers(draw: st.DrawFn) -> bytes:
    entries = draw(st.lists(_entries(), max_size=6))
    n_kv = draw(st.one_of(st.just(len(entries)), _COUNTS))
    data = bytearray(b"GGUF" + struct.pack("<IQQ", draw(st.sampled_from([2, 3, 4])), 0, n_kv)
                     + b"".join(entries))
    for where, value in draw(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)),
                                      max_size=3)):
        data[where % len(data)] = value
    return bytes(data[: draw(st.integers(0, len(data)))]) if draw(st.booleans()) else bytes(data)


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=_headers())
def test_fuzzed_headers_raise_only_the_typed_error(tmp_path: Path, data: bytes) -> None:
    path = _write(tmp_path, data)
    with contextlib.suppress(GGUFHeaderError):
        read_gguf_header(path, lambda key: True)
    with contextlib.suppress(ModelLoadError):
        read_model_info(path)
    entry = ModelEntry.read(path)  # the picker lists the file, with a reason if it is bad
    assert (entry.info is None) == (entry.problem is not None)
