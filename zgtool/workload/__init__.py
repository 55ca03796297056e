"""Workloads for latency-split, bench and verify: datasets (ShareGPT, JSONL, synthetic lengths), Mooncake
trace replay, shared-prefix groups and multi-turn conversations, as per-request specs (spec.py is the entry)."""
