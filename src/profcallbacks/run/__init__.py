"""The orchestrator: the session that drives timing, detectors, captures and sinks for one run."""
