"""Benchmarks: fleet generator (`bench.fleet`) and scenarios (`bench.run`). See bench/README.md."""
