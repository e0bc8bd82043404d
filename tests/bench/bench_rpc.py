"""Benchmark: saving and restoring a 2,000-token state with the layers on RPC workers.

The bundled SmolLM2, flash attention on (RPC needs it), every layer on one loopback worker
reached through a counting TCP relay, against the same model on the CPU alone. For a save
(`state_get`) and a restore (`state_set`): milliseconds (median of 5), bytes, and round trips
(a round trip: the client sends, then the worker answers).

    .venv/bin/python -m tests.bench.bench_rpc
"""

from __future__ import annotations

import selectors
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass

from engine.config.endpoints import parse_endpoint
from engine.config.params import ContextParams, FlashAttention, RuntimeSettings
from engine.llm.rpc import probe, worker_program
from engine.llm.runtime import Runtime
from engine.models.files import default_model_path

TOKENS = 2000
TEXT = " ".join(f"Note {i}: the tide rises twice a day and the delta grows." for i in range(200))


@dataclass
class Relay:
    """Forwards one port to another and counts round trips (client data after worker data)."""

    target: int
    trips: int = 0
    sent: int = 0  # bytes client -> worker
    received: int = 0  # bytes worker -> client

    def start(self) -> int:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        threading.Thread(target=self._serve, daemon=True).start()
        return int(self.listener.getsockname()[1])

    def _serve(self) -> None:
        while True:
            client, _ = self.listener.accept()
            worker = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, worker), daemon=True).start()

    def _pump(self, client: socket.socket, worker: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, worker)
        selector.register(worker, selectors.EVENT_READ, client)
        last_from_worker = True
        with client, worker:  # either side closing closes both (the worker serves one client)
            while True:
                for key, _ in selector.select():
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(1 << 20)
                    if not data:
                        return
                    key.data.sendall(data)
                    if source is client:
                        self.sent += len(data)
                        if last_from_worker:
                            self.trips += 1
                        last_from_worker = False
                    else:
                        self.received += len(data)
                        last_from_worker = True


def measure(runtime: Runtime, relay: Relay | None) -> dict[str, float]:
    ctx = runtime.ctx
    tokens = runtime.model.tokenize(TEXT)[:TOKENS]
    for start in range(0, len(tokens), runtime.n_batch):
        ctx.decode(tokens[start:start + runtime.n_batch], start, want_logits=False)
    saves, restores = [], []
    trips_save = trips_restore = 0
    blob = bytearray()
    for _ in range(5):
        before = relay.trips if relay else 0
        started = time.perf_counter()
        blob = ctx.state_get()
        saves.append(time.perf_counter() - started)
        trips_save = (relay.trips if relay else 0) - before
        ctx.clear()
        before = relay.trips if relay else 0
        started = time.perf_counter()
        ctx.state_set(blob)
        restores.append(time.perf_counter() - started)
        trips_restore = (relay.trips if relay else 0) - before
    return {"save_ms": statistics.median(saves) * 1000,
            "restore_ms": statistics.median(restores) * 1000, "bytes": len(blob),
            "trips_save": trips_save, "trips_restore": trips_restore}


def main() -> int:
    settings = RuntimeSettings(n_ctx=4096, context=ContextParams(flash_attn=FlashAttention.ON))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    worker = subprocess.Popen([str(worker_program()), "--host", "127.0.0.1", "--port",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while probe(parse_endpoint(f"127.0.0.1:{port}"), timeout=1) is not None:
            time.sleep(0.05)
        relay = Relay(port)
        relayed = relay.start()
        rows = []
        for name, runtime_settings, counted in (
            ("CPU only", settings, None),
            ("1 RPC worker (loopback)", RuntimeSettings(
                n_ctx=4096, context=settings.context, rpc_workers=(f"127.0.0.1:{relayed}",)),
             relay),
        ):
            runtime = Runtime(default_model_path(), runtime_settings)
            try:
                rows.append((name, runtime.backend, measure(runtime, counted)))
            finally:
                runtime.close()
        print(f"{TOKENS}-token state, SmolLM2-135M, flash attention on")
        print("| layers on | save | restore | state bytes | round trips (save / restore) |")
        print("|---|---|---|---|---|")
        for name, backend, m in rows:
            print(f"| {name} ({backend}) | {m['save_ms']:.1f} ms | {m['restore_ms']:.1f} ms | "
                  f"{m['bytes']:,} | {m['trips_save']:.0f} / {m['trips_restore']:.0f} |")
    finally:
        worker.kill()
        worker.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
