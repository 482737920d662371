"""The model stage: what a trace says, typed, for the analyses to read."""
