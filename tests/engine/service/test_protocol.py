"""The protocol's values cross the pipe between the window and the engine process pickled:
new fields come through, and an event from a sender without them still reads."""

from __future__ import annotations

import pickle

from engine.models.fit import GpuMemory
from engine.service.protocol import EngineStarted, ModelLoaded

GPU = GpuMemory(free=5 << 30, total=8 << 30, margin=1 << 30, held=2 << 30)


def test_the_gpus_memory_crosses_the_pipe_in_engine_started_and_model_loaded() -> None:
    started = EngineStarted(7, ("chatml",), GPU)
    loaded = ModelLoaded("m", "/m.gguf", "llama", "dense", "CUDA (H100)", 4096, (), gpu=GPU)
    for event in (started, loaded):
        assert pickle.loads(pickle.dumps(event)) == event
    assert GPU.for_a_model == (5 + 2 - 1) << 30  # free, the loaded model's share, less margin


def test_an_event_from_a_sender_without_the_field_reads_as_no_gpu() -> None:
    old = EngineStarted.__new__(EngineStarted)
    old.__dict__.update(pid=7, builtin_templates=("chatml",))  # what an older engine pickles
    read = pickle.loads(pickle.dumps(old))
    assert read.gpu is None and read.pid == 7
    assert EngineStarted(7, ()).gpu is None and ModelLoaded("m", "", "", "", "", 1, ()).gpu is None


def test_what_a_model_may_take_is_never_negative() -> None:
    assert GpuMemory(free=512 << 20, total=8 << 30, margin=1 << 30).for_a_model == 0
