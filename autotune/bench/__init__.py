"""Benchmarks of search quality: recorded landscapes, replay, and today's heuristics."""
