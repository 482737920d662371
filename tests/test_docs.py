"""The documentation: every finding kind catalogued, every code example run on tiny models, no
link leaving the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from profcallbacks import findings

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
CODE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def finding_kinds() -> list[str]:
    return sorted(value for name, value in vars(findings).items()
                  if name.isupper() and not name.startswith("_") and isinstance(value, str))


def catalogue_entries(text: str) -> dict[str, str]:
    parts = re.split(r"^## `([a-z_]+)`\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_finding_kind_has_a_catalogue_entry():
    entries = catalogue_entries((DOCS / "reference" / "findings.md").read_text())
    assert finding_kinds() and sorted(set(finding_kinds()) - set(entries)) == []
    for kind in finding_kinds():
        body = entries[kind]
        for part in ("**Means:**", "**Example:**", "**What to do:**"):
            assert part in body, (kind, part)
        assert f"{kind}:" in body.split("**Example:**")[1], f"{kind}: its example is of another kind"


def test_the_catalogue_test_sees_a_missing_entry():
    text = (DOCS / "reference" / "findings.md").read_text()
    without = re.sub(r"^## `sync_point`\n", "## sync points\n", text, flags=re.MULTILINE)
    assert "sync_point" not in catalogue_entries(without)


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(DOCS)) for p in PAGES if f" {p.relative_to(DOCS)}" not in nav]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_no_link_leaves_the_repository(page):
    text = page.read_text()
    for target in LINK.findall(text):
        assert not re.match(r"[a-z]+://", target), f"{page.name}: external link {target}"
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(DOCS), f"{page.name}: {target} leaves docs/"
        assert path.exists(), f"{page.name}: {target} does not exist"
    assert "/work/" not in text and "../shared" not in text


def tiny_plain() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x = torch.randn(80, 8)
    return {"torch": torch, "model": model, "loss_fn": nn.functional.mse_loss,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.01),
            "loader": DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)}


def tiny_lightning() -> dict:
    import lightning.pytorch as pl

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = pl.LightningDataModule.from_datasets(TensorDataset(torch.randn(400, 8)), batch_size=4)
    return {"model": Tiny(), "datamodule": data}


def tiny_hf(tmp_path: Path) -> dict:
    import transformers

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 1)

        def forward(self, x):
            return {"loss": self.net(x).pow(2).mean()}

    ds = [{"x": torch.randn(8)} for _ in range(160)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=20, per_device_train_batch_size=4,
        use_cpu=True, report_to=[], save_strategy="no",
        disable_tqdm=True, remove_unused_columns=False)
    return {"model": Tiny(), "args": args, "ds": ds, "eval_ds": ds[:16]}


EXAMPLES = [p for p in PAGES if CODE.search(p.read_text())]


@pytest.mark.parametrize("page", EXAMPLES, ids=lambda p: str(p.relative_to(DOCS)))
def test_code_examples_run(page, tmp_path, monkeypatch):
    """A page's ``python`` blocks run in order, in one namespace holding the tiny model, loader
    and optimizer (or Trainer inputs) the examples refer to."""
    monkeypatch.chdir(tmp_path)
    name = page.name
    if name == "trackers.md":
        pytest.importorskip("wandb")
        pytest.importorskip("mlflow")
        for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
                           "WANDB_SILENT": "true",
                           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}.items():
            monkeypatch.setenv(key, value)
    namespace = tiny_plain()
    if name == "lightning.md":
        namespace.update(tiny_lightning())
    elif name == "huggingface.md":
        namespace.update(tiny_hf(tmp_path))
    for block in CODE.findall(page.read_text()):
        exec(compile(block, f"{page.relative_to(ROOT)}", "exec"), namespace)
