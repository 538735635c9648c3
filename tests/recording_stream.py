"""A soak worker's stream (``optcheck.drivers.protocol.Stream``) kept in memory, for tests that run
the worker loop in their own process (``optcheck.drivers.worker_loop.Loop`` / ``run``)."""

from __future__ import annotations


class RecordingStream:
    """Every message sent, as ``(type, payload)``; no supervisor, so no verdict."""

    def __init__(self):
        self.msgs: list[tuple[str, dict]] = []

    def send(self, type, **payload):
        self.msgs.append((type, payload))

    def verdict(self):
        return {}

    def close(self):
        pass

    def of(self, kind: str) -> list[dict]:
        """The payloads of the messages of ``kind``."""
        return [p for t, p in self.msgs if t == kind]
