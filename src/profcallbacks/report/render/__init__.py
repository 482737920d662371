"""The render stage: the report as text, HTML and plots."""
