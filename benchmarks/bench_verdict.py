"""What ``--stop-on-finding`` costs the worker: one verdict round trip per pre-step check
snapshot (``optcheck/drivers/protocol.py``), against sending the same snapshot without waiting.

A real ``socket.socketpair()``, a supervisor thread that reads the stream, runs the run's
rule engine on each snapshot (``optcheck.run.checker.Checker``) and answers, and
real snapshots of a soak run directory. Prints medians in ms and their ratio; nothing
is asserted (timings on a shared machine are noisy)::

    python benchmarks/bench_verdict.py RUN_DIR [--repeat 50]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time

from optcheck.engine import RuleEngine
from optcheck.drivers.protocol import Stream, read_messages, send_verdict
from optcheck.run.checker import Checker
from optcheck.record.check import read_snapshots


def supervise(sock: socket.socket) -> None:
    checker = Checker(RuleEngine())
    with os.fdopen(os.dup(sock.fileno()), encoding="utf-8") as f:
        for msg in read_messages(f):
            new = checker.check(msg["snapshot"]) if msg["type"] == "snapshot" else []
            if msg.get("verdict"):
                send_verdict(sock, f"{new[0].code}" if new else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    snaps = read_snapshots(os.path.join(args.run_dir, "snapshots.jsonl"))
    ours, theirs = socket.socketpair()
    t = threading.Thread(target=supervise, args=(ours,), daemon=True)
    t.start()
    stream = Stream(os.dup(theirs.fileno()))
    for s in snaps:  # warm up: imports, the engine's first snapshots
        stream.send("snapshot", snapshot=s, verdict=True)
        stream.verdict()
    send_only, with_verdict = [], []
    for i in range(args.repeat):  # the worker never waits: the supervisor checks them behind it
        s = snaps[1 + i % (len(snaps) - 1)]
        t0 = time.perf_counter()
        stream.send("snapshot", snapshot=s, verdict=False)
        send_only.append(time.perf_counter() - t0)
    stream.send("snapshot", snapshot=snaps[-1], verdict=True)
    stream.verdict()  # the supervisor has caught up
    for i in range(args.repeat):  # --stop-on-finding: the worker waits for each check
        s = snaps[1 + i % (len(snaps) - 1)]
        t0 = time.perf_counter()
        stream.send("snapshot", snapshot=s, verdict=True)
        stream.verdict()
        with_verdict.append(time.perf_counter() - t0)
    stream.close()
    theirs.close()
    t.join(timeout=30)
    a, b = statistics.median(send_only) * 1e3, statistics.median(with_verdict) * 1e3
    print(f"snapshots from {args.run_dir}: {len(snaps)}; repeat {args.repeat}")
    print(f"send only      median {a:.2f} ms")
    print(f"send + verdict median {b:.2f} ms  ({b / a:.1f}x; paid only at a pre-step check snapshot)")


if __name__ == "__main__":
    main()
