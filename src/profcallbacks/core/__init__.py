"""The framework-free core: the step state machine, step timing, ranks and where results are written."""
