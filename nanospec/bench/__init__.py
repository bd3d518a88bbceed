"""Benchmarks and analyses of NanoSpec (each a ``python -m nanospec.bench.NAME`` command)."""
