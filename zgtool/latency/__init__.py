"""`zgtool latency-split`: per-phase latency decomposition with server-side attribution.

Grouped by stage (GuideLLM's backend / scheduler / benchmark / outputs):

- config (SplitConfig, SLOs, prompts) and records (RequestSample, EngineTiming, the per-target and
  per-run results): leaves every stage imports;
- wire/: the instrumented client (transport, client, stream reader, API detection);
- schedule/: what is sent when (closed-loop runner, open loop, arrivals, sweeps, CPU watch);
- attribution/: what the servers say about themselves (engine adapters, Server-Timing, OTLP,
  Prometheus deltas) and the join of those with the client's phases;
- analysis/: statistics over the samples (phases and gateway tax, design, open-loop, saturation);
- render/: terminal output only, from the analysed results.

Import submodules directly; this package imports nothing so the CLI stays fast.
"""
