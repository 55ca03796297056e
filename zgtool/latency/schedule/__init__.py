"""The schedule: which request is sent when (closed-loop rounds, open-loop dispatch, arrival offsets,
load sweeps) and the CPU time read around each block."""
