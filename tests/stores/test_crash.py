"""Crash safety: a writer SIGKILLed at random moments never loses an acknowledged append.

A child process appends to a session in a loop and prints each node id once `append` has
returned (that is the acknowledgement). The parent kills it — at a random moment, or, every
other round, in the middle of a write (that child's "disk" takes the first 2 KB of its second
append, says so, and hangs) — several rounds in a row, each round's child loading what the
previous one left. After every kill the log
must load (never fatal), hold every acknowledged append, report a torn tail exactly when the
file ends mid-line, and accept appends again — which seal the torn bytes into one bad line.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from compactd.context.engine import Engine
from compactd.context.session import Library
from compactd.context.stores.files import TORN_SEAL, FileStore

from tests.engine.helpers import new_session, user

REPO = Path(__file__).resolve().parents[2]
SID = "crash"
ROUNDS = 8

CHILD = textwrap.dedent(
    """
    import os
    import sys
    import time

    root, sid, tag, hang = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "hang"
    if hang:  # a disk that takes the first 2 KB of the next append and then hangs
        real_write = os.write
        acked = [0]

        def write(fd, data):
            written = real_write(fd, bytes(memoryview(data)[:2048]))
            if acked[0] and written < len(data):
                print("W", flush=True)  # part of an append is in the file, the rest is not
                time.sleep(60)
            return written

        os.write = write

    from compactd.context.engine import Engine
    from compactd.context.stores.files import FileStore

    engine = Engine(FileStore(root))
    k = 0
    while True:
        k += 1
        text = f"{tag}-{k} " + "x" * (8000 + (k * 7919) % 7 * 3000)
        res = engine.append(sid, messages=[{"role": "user", "content": text}])
        print("ack", res.node_ids[0], f"{tag}-{k}", flush=True)
        if hang:
            acked[0] += 1
    """
)


class Child:
    """One writer process and the lines it printed (complete lines only)."""

    def __init__(self, root: Path, tag: str, hang: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), SID, tag, "hang" if hang else "run"],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        self.buf = b""
        self.lines: list[list[str]] = []

    def read_until(self, word: str, timeout: float = 60.0) -> bool:
        """Read until the child has printed a line starting with `word`."""
        stdout = self.proc.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            if any(line[0] == word for line in self.lines):
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([stdout], [], [], left)[0]:
                return False
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                return False
            self.buf += chunk
            *done, self.buf = self.buf.split(b"\n")
            self.lines += [line.decode().split() for line in done]

    def kill(self) -> dict[str, str]:
        """SIGKILL it; the appends it acknowledged (node id -> tag)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        assert self.proc.returncode == -signal.SIGKILL, self.proc.returncode
        stdout = self.proc.stdout
        assert stdout is not None
        rest = self.buf + stdout.read()
        self.lines += [line.decode().split() for line in rest.split(b"\n")[:-1]]
        return {line[1]: line[2] for line in self.lines if line[0] == "ack"}


def test_sigkill_never_loses_an_acknowledged_append(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    root = tmp_path / "data"
    engine = Engine(FileStore(root))
    new_session(engine, SID)
    log = engine.store.log_path(SID)
    acked: dict[str, str] = {}  # node id -> tag
    torn_seen = 0
    for round_no in range(ROUNDS):
        # every other round kills mid-write (its disk hangs half way through its second
        # append); the others at a random moment
        hang = round_no % 2 == 1
        child = Child(root, f"r{round_no}", hang)
        try:
            assert child.read_until("ack"), "the writer never acknowledged an append"
            if hang:
                assert child.read_until("W")
            else:
                time.sleep(rng.uniform(0.0, 0.1))
        finally:
            acked.update(child.kill())

        raw = log.read_bytes()
        loaded = Library(FileStore(root)).load(SID)  # never fatal
        torn = not raw.endswith(b"\n")
        assert torn or not hang, "a kill in the middle of a write left no torn tail"
        torn_seen += torn
        assert loaded.report.torn_tail == torn
        nodes = loaded.graph.nodes
        missing = [node_id for node_id in acked if node_id not in nodes]
        assert not missing, f"round {round_no}: acknowledged appends lost: {missing}"
        for node_id, tag in acked.items():
            assert nodes[node_id].content[0]["text"].startswith(f"{tag} ")
        # the only bad lines are torn tails sealed by the next writer
        lines = raw.split(b"\n")
        for line_no in loaded.report.bad_lines:
            assert line_no > 0 and lines[line_no - 1].endswith(TORN_SEAL.rstrip(b"\n"))

    # after all that, the session takes appends and reloads clean but for the sealed lines
    final = Engine(FileStore(root))
    res = final.append(SID, messages=[user("after the crashes")])
    again = Library(FileStore(root)).load(SID)
    assert not again.report.torn_tail
    assert res.node_ids[0] in again.graph.nodes
    assert all(node_id in again.graph.nodes for node_id in acked)
    seqs = [n.seq for n in again.graph.nodes.values()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # every kill mid-write tore the tail, and each torn tail became exactly one bad line
    assert torn_seen >= ROUNDS // 2
    assert len(again.report.bad_lines) == torn_seen
