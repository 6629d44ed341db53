"""The takeover tests' fixture: HyperShift's real `hcp-inputs`, unpacked once per session."""

from testsupport.hcp_inputs import hcp_inputs  # noqa: F401 (a fixture, found by pytest here)
