"""The ground floor: step timing, ranks, device timing, trigger names and faults, used by every part."""
