"""A process that writes conversations as fast as it can; the crash test SIGKILLs it.

It prints "ready" once the store is open. After each action returns (its transaction
committed) it prints one line:
    created <conversation> <root>            a new conversation
    sent <conversation> <user> <reply>       a user message and its complete reply
The test checks that everything printed is in the database, whole.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from engine.store import Store, StoreSink
from engine.tree import NodeStatus, Role, Tree


def main() -> None:
    db, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    store = Store(db)
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


if __name__ == "__main__":
    main()
