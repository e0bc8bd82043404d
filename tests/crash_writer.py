"""Processes that the crash tests SIGKILL.

`python -m tests.crash_writer <db> <seed>` writes conversations as fast as it can. It prints
"ready" once the store is open. After each action returns (its transaction committed) it
prints one line:
    created <conversation> <root>            a new conversation
    sent <conversation> <user> <reply>       a user message and its complete reply
and before an action that removes messages, one line (the action may or may not be done):
    deleting <conversation> <node>           the branch from `node` down
    purging <conversation>                   the whole conversation
The test checks that everything printed and not since removed is in the database, whole.

`python -m tests.crash_writer <db> import` imports ten conversations in slices of 100
messages and kills itself after the third slice.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import engine.storage.store
from engine.core.records import from_tree
from engine.core.tree import NodeStatus, Role, Tree
from engine.storage.store import Store, StoreSink


def write(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    conversations: list[int] = [c.id for c in store.list()]
    print("ready", flush=True)  # the test's clock starts here, not at the interpreter's start
    while True:
        if not conversations or rng.random() < 0.2:
            tree = Tree(f"system {seed}")
            cid = store.create(tree, title=f"run {seed}")
            conversations.append(cid)
            print(f"created {cid} {tree.root_id}", flush=True)
            continue
        cid = rng.choice(conversations)
        tree = store.load(cid)
        if len(conversations) > 1 and rng.random() < 0.05:
            print(f"purging {cid}", flush=True)
            conversations.remove(cid)
            store.delete(cid)
            store.purge(older_than_s=0)
            continue
        users = [n.id for n in tree.nodes() if n.role is Role.USER]
        if users and rng.random() < 0.1:
            top = rng.choice(users)
            print(f"deleting {cid} {top}", flush=True)
            store.save(cid, tree, deleted=tree.delete_branch(top))
            continue
        sink = StoreSink(store, cid, interval_s=0.0)
        text = f"message {rng.random():.6f} " + "x" * rng.randrange(0, 3000)
        user = tree.add_child(tree.active_leaf, Role.USER, text)
        reply = tree.add_child(user.id, Role.ASSISTANT, "", status=NodeStatus.STREAMING)
        sink.action(tree, [user, reply])
        for word in ("reply", " to", f" {user.id}"):
            reply.text += word
            sink.streaming(reply)
        reply.status = NodeStatus.COMPLETE
        reply.tokens = tuple(range(rng.randrange(1, 50)))
        sink.action(tree, [reply])
        print(f"sent {cid} {user.id} {reply.id}", flush=True)


def import_and_die(store: Store) -> None:
    engine.storage.store.IMPORT_SLICE = 100
    records = []
    for i in range(10):
        tree = Tree("sys")
        for j in range(59):
            tree.add_child(tree.active_leaf, Role.USER if j % 2 == 0 else Role.ASSISTANT,
                           f"imported message {j}")
        records.append(from_tree(tree, title=f"imported {i}"))
    slices = 0

    def die_after_the_third(_done: int, _total: int) -> None:
        nonlocal slices
        slices += 1
        if slices == 3:
            os.kill(os.getpid(), signal.SIGKILL)

    store.import_records(records, progress=die_after_the_third)


def main() -> None:
    db, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "import":
        import_and_die(Store(db, recover=False))
    else:
        write(Store(db), int(mode))


if __name__ == "__main__":
    main()
