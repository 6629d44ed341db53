"""Benchmarks: the scenarios (`python -m bench <command>`, bench/__main__.py); the fleets they serve are testsupport/fleet.py's. See bench/README.md."""
