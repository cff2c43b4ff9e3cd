"""Throughput benchmarks (`rlvr-bench`) and the loss lab."""
