"""Expert diagnoses: the specific, fixable patterns in a capture, ranked by what each costs.

Example:
    >>> from profcallbacks.report.analyse.diagnoses import KINDS
    >>> KINDS[0]
    'cold_start'
"""

from profcallbacks.report.analyse.diagnoses.model import Diagnosis
from profcallbacks.report.analyse.diagnoses.registry import KINDS, diagnose_events, run_rules

__all__ = ["KINDS", "Diagnosis", "diagnose_events", "run_rules"]
