"""Capture windows: the schedule, triggers, one torch.profiler per window, and the trace export."""
