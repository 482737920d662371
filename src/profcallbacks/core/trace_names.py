"""Names torch.profiler gives events, which both the trace writer and the trace reader look for."""

DATALOADER_PREFIXES = ("enumerate(DataLoader)#", "enumerate(DataPipe)#")
"""Event names of a batch fetched from a DataLoader (or a DataPipe): the step's data wait."""
