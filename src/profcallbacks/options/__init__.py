"""Every option of the profiler, its validation and its bounds; imports nothing else of the package."""
