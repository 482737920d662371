"""The read stage: find a run's files, decode every trace generation, stream big traces."""
