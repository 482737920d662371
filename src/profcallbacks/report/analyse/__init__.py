"""The analyse stage: breakdowns, verdicts, diagnoses, advice, statistics, throughput."""
