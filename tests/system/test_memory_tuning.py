"""The allocator settings of a serving process (ignition_server.memory), checked by what the
kernel counts: page faults while ~300 KiB response buffers are made and freed over and over."""

from __future__ import annotations

import subprocess
import sys
import textwrap

ROUNDS = 400
CHURN = textwrap.dedent(f"""
    import resource, sys
    from ignition_server import memory
    if sys.argv[1] == "tuned":
        assert memory.tune(memory.SERVING_MMAP_THRESHOLD)
    elif sys.argv[1] == "threshold-only":  # the mmap threshold fixed, the trim threshold left alone
        libc = memory._libc()
        libc.mallopt(-3, memory.SERVING_MMAP_THRESHOLD)
    body = bytes(300 * 1024)
    keep = [bytes(64) for _ in range(1000)]  # small live objects, as a server has
    for _ in range(20):
        b"".join((b"headers", body))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range({ROUNDS}):
        b"".join((b"headers", body))  # a response's bytes: made, sent, freed
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def faults_per_round(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip()) / ROUNDS


def test_a_serving_process_reuses_response_buffers_instead_of_faulting_them_in() -> None:
    # What the fix is for: the threshold alone gives each freed buffer back and faults it in again.
    assert faults_per_round("threshold-only") > 20
    assert faults_per_round("tuned") < 1
