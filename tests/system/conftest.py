"""The system tests' fixtures beside tests/conftest.py's: HyperShift's real `hcp-inputs` (the takeover's)."""

from testsupport.hcp_inputs import hcp_inputs  # noqa: F401 (a fixture, found by pytest here)
