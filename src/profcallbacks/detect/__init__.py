"""Detectors: small online analyses of step timing (and short audits) that produce findings."""
