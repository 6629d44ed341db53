"""What the tests and the benchmarks share, imported by one name (`testsupport.harness`), so a
server a benchmark helper starts inside a test is the one `tests/conftest.py` cleans up.

Not part of the installed server: found through the repository's root on `sys.path`
(pytest's `pythonpath = ["."]`; `python -m bench` run from the root).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the repository's root (deploy/, examples/, the Dockerfile)
