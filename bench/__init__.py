"""Benchmarks: figures printed side by side with a peer, never asserted (`make bench`)."""
