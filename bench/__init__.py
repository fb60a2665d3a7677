"""Benchmarks: each prints its figures next to a peer measured in the same run."""
