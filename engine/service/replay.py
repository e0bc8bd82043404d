"""Drive a scenario headless on a real model and report every step (`python -m engine replay`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from engine.config.params import CacheMode, CheckpointOptions
from engine.core.records import from_tree
from engine.core.tree import Role, TreeError
from engine.llm.runtime import Runtime, RuntimeSettings
from engine.models.files import resolve_model
from engine.service.client import ClientKind, EngineClient, engine_log
from engine.service.protocol import EngineOptions
from engine.service.scenario import Op, Scenario, ScenarioError, Step
from engine.service.session import GenerationOptions, Session, StepReport
from engine.storage.checkpoints import CheckpointStore
from engine.storage.formats.arbor_file import write_session
from engine.storage.keyfile import installation_key
from engine.storage.store import Store, StoreSink

log = logging.getLogger(__name__)


def replay(
    scenario: Scenario,
    *,
    model: str | None = None,
    cache: CacheMode = CacheMode.CHECKPOINTS,
    runtime_settings: RuntimeSettings | None = None,
    checkpoints: CheckpointOptions | None = None,
    db: Path | None = None,
    engine_process: bool = False,
    rpc_workers: tuple[str, ...] = (),
    on_step: Callable[[int, dict[str, Any] | None], None] | None = None,
) -> dict[str, Any]:
    """Run every step and return the report (a JSON-ready dict). With `db`, the
    conversation is persisted to that store as it goes, one transaction per action. With
    `engine_process`, the model runs in an engine process of its own, as in the app, and
    every reply crosses the same protocol as the window's. `on_step` hears each step's index
    and the checkpoint store's figures after it (None without the cache)."""
    path = resolve_model(model or scenario.model, base=scenario.base_dir)
    settings = runtime_settings or RuntimeSettings(n_ctx=scenario.n_ctx, n_batch=scenario.n_batch)
    if rpc_workers:
        settings = replace(settings, rpc_workers=rpc_workers)
    # A worker that dies makes llama.cpp abort its process: never this one.
    engine_process = engine_process or bool(settings.rpc_workers)
    options = checkpoints or CheckpointOptions()
    use_cache = cache is CacheMode.CHECKPOINTS
    with contextlib.ExitStack() as stack:
        if engine_process:
            remote = EngineClient.make(ClientKind.PROCESS, log_file=engine_log())
            stack.callback(remote.close)
            loaded = remote.load(str(path), EngineOptions(
                settings, scenario.sampling, options, use_cache, scenario.template))
            session = Session(None, system=scenario.system, seed=scenario.seed,
                              sampling=scenario.sampling, use_cache=use_cache, engine=remote,
                              overflow=scenario.overflow)
            model_info, template, notices = dict(loaded.details), loaded.template_name, \
                list(loaded.notices)

            def store_stats() -> dict[str, Any] | None:
                return remote.store_report() if use_cache else None
        else:
            runtime = Runtime(path, settings)
            stack.callback(runtime.close)
            store = CheckpointStore(
                runtime.identity(), key=installation_key(), ram_budget=options.ram_budget,
                disk_dir=options.disk_dir, disk_budget=options.disk_budget,
            ) if use_cache else None
            session = Session(
                runtime, system=scenario.system, sampling=scenario.sampling,
                seed=scenario.seed, use_cache=use_cache, checkpoints=store,
                checkpoint_interval=options.interval, template=scenario.template,
                overflow=scenario.overflow,
            )
            assert session.generator is not None
            model_info, template, notices = runtime.report(), \
                session.generator.template.name, list(runtime.notices)

            def store_stats() -> dict[str, Any] | None:
                return asdict(store.stats()) if store is not None else None
        session.model = model_info
        if scenario.tools:
            session.set_tools([dict(tool) for tool in scenario.tools])
        conversation_id = None
        if db is not None:
            conversations = Store(db)
            stack.callback(conversations.close)
            title = next((s.text for s in scenario.steps if s.text), "Replay") or "Replay"
            conversation_id = conversations.create(session.tree, title=title[:80],
                                                   model=model_info)
            session.sink = StoreSink(conversations, conversation_id)
        steps = []
        for index, step in enumerate(scenario.steps):
            steps.append(_step_dict(run_step(session, step)))
            if on_step is not None:
                on_step(index, store_stats())
        if isinstance(session.sink, StoreSink):  # a fork moves on to a new conversation
            conversation_id = session.sink.conversation_id
        return {
            "conversation_id": conversation_id,
            "model": model_info,
            "chat_template": template,
            "cache": cache.value,
            "engine": "process" if engine_process else "in-process",
            "seed": scenario.seed,
            "steps": steps,
            "checkpoints": _store_report(store_stats(), options),
            "notices": notices,
        }


def run_step(session: Session, step: Step) -> StepReport:
    tree = session.tree
    options = GenerationOptions(max_tokens=step.max_tokens, tool_choice=step.tool_choice)
    try:
        match step.op:
            case Op.SEND:
                assert step.text is not None
                return session.send(step.text, options)
            case Op.REGENERATE:
                target = tree.message(step.message).id if step.message is not None else None
                return session.regenerate(options, node_id=target)
            case Op.EDIT:
                assert step.message is not None and step.text is not None
                return session.edit(tree.message(step.message).id, step.text, options)
            case Op.SWITCH:
                assert step.message is not None and step.variant is not None
                return session.switch(tree.message(step.message).id, step.variant)
            case Op.REWIND:
                assert step.message is not None
                return session.rewind(tree.message(step.message).id)
            case Op.WARM:
                return session.warm(options)
            case Op.CONTINUE:
                leaf = tree.node(tree.active_leaf)
                if leaf.role is Role.USER:
                    return session.continue_reply(options)
                return session.resume(leaf.id, options)
            case Op.DELETE:
                assert step.message is not None
                return session.delete_branch(tree.message(step.message).id)
            case Op.UNDO:
                return session.undo()
            case Op.FORK:
                assert step.message is not None
                return session.fork(tree.message(step.message).id)
            case Op.SYSTEM:
                assert step.text is not None
                return session.set_system(step.text)
            case Op.ACTIVATE:
                assert step.message is not None and step.variant is not None
                siblings = tree.siblings(tree.message(step.message).id)
                if not 0 <= step.variant < len(siblings):
                    raise TreeError(f"variant {step.variant} does not exist (the message has "
                                    f"{len(siblings)} versions)")
                return session.activate(siblings[step.variant])
            case Op.RESULTS:
                return session.answer_calls(step.texts, options)
            case Op.EXPORT:
                assert step.path is not None
                out = Path(step.path)
                identity = {key: session.model.get(key)
                            for key in ("name", "file_sha256", "architecture")}
                record = from_tree(session.tree, title="Replay", model=identity)
                write_session(out, [record])
                return StepReport(op="export", node_id=tree.active_leaf, text=str(out))
    except TreeError as exc:
        raise ScenarioError(f"{step.describe()}: {exc}") from exc
    except OSError as exc:
        raise ScenarioError(f"{step.describe()}: cannot write {step.path}: {exc}") from exc
    raise AssertionError(step.op)


def _store_report(stats: dict[str, Any] | None, options: CheckpointOptions) -> dict[str, Any]:
    if stats is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "interval": options.interval,
        "disk_tier": str(options.disk_dir) if options.disk_dir else None,
        **stats,
    }


# The figures of a step in the report, in this order; None where the step ran no model.
_FIGURES = ("prompt_tokens", "reused_tokens", "decoded_tokens", "source", "checkpoint_pos",
            "prefill_ms", "ttft_ms", "generated_tokens", "decode_ms", "dropped")


def _step_dict(step: StepReport) -> dict[str, Any]:
    figures = asdict(step.report) if step.report is not None else {}
    out: dict[str, Any] = {"op": step.op, "node_id": step.node_id}
    for key in _FIGURES:
        value = figures.get(key)
        out[key] = round(value, 2) if isinstance(value, float) else value
    out["text"] = step.text
    out["finish"] = figures.get("finish")
    for key in ("source", "finish"):
        if out[key] is not None:
            out[key] = str(out[key])
    return out
