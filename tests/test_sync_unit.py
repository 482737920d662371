"""The sync audit, unit level: its budget, known library fixes, cancelling, the options."""

import pytest
import torch

from profcallbacks import SyncAuditConfig
from profcallbacks.detect.sync_audit import SyncAuditor
from profcallbacks.detect.sync_fixes import known_fix


def test_the_default_audit_budget_is_6_steps():
    assert SyncAuditConfig().audited_steps == (19, 20, 21, 99, 100, 101)


def test_library_sites_get_their_own_lines_and_known_fixes():
    """The HF Trainer's NaN/Inf filter and Lightning's conversion of logged values, found in
    the installed libraries' sources (line numbers looked up, never hard-coded)."""
    import lightning.fabric.utilities.apply_func as apply_func
    import transformers.trainer as trainer

    def line_of(module, needle):
        with open(module.__file__, encoding="utf-8") as f:
            return next(i for i, line in enumerate(f, 1) if needle in line)

    hf = f"{trainer.__file__}:{line_of(trainer, 'and (torch.isnan(tr_loss_step)')}"
    assert "logging_nan_inf_filter=False" in known_fix(hf)
    pl = f"{apply_func.__file__}:{line_of(apply_func, 'return value.item()')}"
    assert "prog_bar=False" in known_fix(pl)
    assert known_fix(f"{trainer.__file__}:1") is None


def test_auditor_restores_everything_when_cancelled():
    auditor = SyncAuditor(SyncAuditConfig(at_step=0, steps=1))
    auditor.begin_step(0)
    assert "tolist" in torch.Tensor.__dict__
    auditor.cancel()
    assert "tolist" not in torch.Tensor.__dict__ and auditor.next_step == 0


@pytest.mark.parametrize("kwargs, words", [({"steps": 0}, "steps"), ({"allow": "x.py"}, "allow"),
                                           ({"at_step": -1}, "at_step"),
                                           ({"warn_blocking_ms": -1}, "warn_blocking_ms")])
def test_bad_audit_config_names_the_parameter(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SyncAuditConfig(**kwargs)
