"""Drive a scenario headless on a real model and report every step (`python -m engine replay`)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.checkpoints import CheckpointStore
from engine.formats.native import write_session
from engine.model import file_sha256, resolve_model
from engine.params import CacheMode, CheckpointOptions
from engine.records import from_tree
from engine.runtime import Runtime, RuntimeSettings
from engine.scenario import Op, Scenario, ScenarioError, Step
from engine.session import GenerationOptions, Session, StepReport
from engine.store import Store, StoreSink
from engine.tree import Role, TreeError

log = logging.getLogger(__name__)


def replay(
    scenario: Scenario,
    *,
    model: str | None = None,
    cache: CacheMode = CacheMode.CHECKPOINTS,
    runtime_settings: RuntimeSettings | None = None,
    checkpoints: CheckpointOptions | None = None,
    db: Path | None = None,
) -> dict[str, Any]:
    """Run every step and return the report (a JSON-ready dict). With `db`, the
    conversation is persisted to that store as it goes, one transaction per action."""
    path = resolve_model(model or scenario.model, base=scenario.base_dir)
    settings = runtime_settings or RuntimeSettings(n_ctx=scenario.n_ctx, n_batch=scenario.n_batch)
    options = checkpoints or CheckpointOptions()
    runtime = Runtime(path, settings)
    with contextlib.ExitStack() as stack:
        stack.callback(runtime.close)
        store = None
        if cache is CacheMode.CHECKPOINTS:
            store = CheckpointStore(
                runtime.identity(),
                ram_budget=options.ram_budget,
                disk_dir=options.disk_dir,
                disk_budget=options.disk_budget,
            )
        session = Session(
            runtime,
            system=scenario.system,
            sampling=scenario.sampling,
            seed=scenario.seed,
            use_cache=cache is CacheMode.CHECKPOINTS,
            checkpoints=store,
            checkpoint_interval=options.interval,
            template=scenario.template,
        )
        conversation_id = None
        if db is not None:
            conversations = Store(db)
            stack.callback(conversations.close)
            title = next((s.text for s in scenario.steps if s.text), "Replay") or "Replay"
            conversation_id = conversations.create(
                session.tree, title=title[:80], model=model_report(runtime)
            )
            session.sink = StoreSink(conversations, conversation_id)
        steps = [_step_dict(run_step(session, step)) for step in scenario.steps]
        if isinstance(session.sink, StoreSink):  # a fork moves on to a new conversation
            conversation_id = session.sink.conversation_id
        return {
            "conversation_id": conversation_id,
            "model": model_report(runtime),
            "chat_template": session.generator.template.name,
            "cache": cache.value,
            "seed": scenario.seed,
            "steps": steps,
            "checkpoints": _store_report(store, options),
            "notices": list(runtime.notices),
        }


def run_step(session: Session, step: Step) -> StepReport:
    tree = session.tree
    options = GenerationOptions(max_tokens=step.max_tokens)
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
                return session.warm()
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
            case Op.EXPORT:
                assert step.path is not None
                out = Path(step.path)
                record = from_tree(session.tree, title="Replay", model=_model_identity(session))
                write_session(out, [record])
                return StepReport(op="export", node_id=tree.active_leaf, text=str(out))
    except TreeError as exc:
        raise ScenarioError(f"{step.describe()}: {exc}") from exc
    except OSError as exc:
        raise ScenarioError(f"{step.describe()}: cannot write {step.path}: {exc}") from exc
    raise AssertionError(step.op)


def _model_identity(session: Session) -> dict[str, Any]:
    model = session.runtime.model
    return {"name": model.info.name, "file_sha256": file_sha256(model.path),
            "architecture": model.info.architecture}


def model_report(runtime: Runtime) -> dict[str, Any]:
    model = runtime.model
    params = runtime.ctx.params
    return {
        "name": model.info.name,
        "path": str(model.path),
        "file_sha256": file_sha256(model.path),
        "architecture": model.info.architecture,
        "memory_kind": runtime.memory_kind.value,
        "n_swa": runtime.n_swa,
        "swa_full": params.swa_full,
        "n_ctx": runtime.n_ctx,
        "n_batch": runtime.n_batch,
        "n_params": model.n_params,
        "size_bytes": model.info.size_bytes,
        "backend": runtime.backend,
        "llama_cpp_python": metadata.version("llama-cpp-python"),
    }


def _store_report(store: CheckpointStore | None, options: CheckpointOptions) -> dict[str, Any]:
    if store is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "interval": options.interval,
        "disk_tier": str(options.disk_dir) if options.disk_dir else None,
        **asdict(store.stats()),
    }


# The figures of a step in the report, in this order; None where the step ran no model.
_FIGURES = ("prompt_tokens", "reused_tokens", "decoded_tokens", "source", "checkpoint_pos",
            "prefill_ms", "ttft_ms", "generated_tokens", "decode_ms")


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
