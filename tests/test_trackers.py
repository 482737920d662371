"""Scalars and findings in W&B (offline), MLflow (local SQLite store) and Lightning's loggers,
read back from what those tools wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from front_ends import OPTIONS, SleepyDataset, hf_trainer, lightning_trainer, plain_loop
from profcallbacks import Schedule, StepProfiler
from profcallbacks.findings import SYNC_POINT, markdown_text
from tracker_files import (
    csv_rows,
    mlflow_findings,
    mlflow_metric,
    series,
    wandb_artifacts,
    wandb_history,
    wandb_run_dir,
    wandb_summary,
    wandb_table,
)

STEPS = 8
EXAMPLES = Path(__file__).parents[1] / "examples"
RUN_OPTIONS = {**OPTIONS, "log_every_n_steps": 2}
STEP_TIME = "profcallbacks/step_time_ms"
SYNC_COUNT = f"profcallbacks/findings/{SYNC_POINT}"


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                        "WANDB_PROJECT": "profcallbacks-test", "WANDB_DISABLE_GIT": "true"}.items():
        monkeypatch.setenv(name, value)
    wandb.teardown()  # the settings of an earlier run (its directory) go with it
    yield wandb
    if wandb.run is not None:
        wandb.finish()
    wandb.teardown()


@pytest.fixture
def mlflow_local(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # the store's default artifact root, ./mlruns, lands here
    mlflow.set_tracking_uri(uri)
    yield mlflow
    if mlflow.active_run() is not None:
        mlflow.end_run()


def sync_rows(findings):
    return [f for f in findings if f.kind == SYNC_POINT]


def expected_counts(findings):
    """(step, running count) of the sync-point findings: what the count scalar must show."""
    return [(f.step, float(i + 1)) for i, f in enumerate(sync_rows(findings))]


def steps_of(pairs):
    return [step for step, _ in pairs]


def plausible_step_times(pairs):
    return all(15 < value < 500 for _, value in pairs)  # the scenario's steps sleep 20 ms


def test_plain_loop_into_an_open_wandb_run(tmp_path, wandb_offline):
    from profcallbacks.integrations.wandb_run import STEP_KEY, WandbSink

    run = wandb_offline.init(dir=str(tmp_path))
    findings = plain_loop(tmp_path / "log", SleepyDataset(0.0), STEPS,
                          {**RUN_OPTIONS, "metrics_sink": WandbSink(run)})
    run.finish()
    wandb_offline.teardown()
    run_dir = wandb_run_dir(tmp_path)
    rows = wandb_history(run_dir)
    times = series(rows, STEP_TIME, STEP_KEY)
    assert steps_of(times) == [1, 3, 5, 7] and plausible_step_times(times)
    assert series(rows, SYNC_COUNT, STEP_KEY) == expected_counts(findings)
    table = wandb_table(run_dir, rows, "profcallbacks/findings")
    assert table["columns"] == ["step", "rank", "kind", "severity", "message"]
    assert [r[2] for r in table["data"]] == [f.kind for f in findings]
    assert sync_rows(findings) and table["data"][0][4] == findings[0].message


def test_plain_loop_into_an_mlflow_run(tmp_path, mlflow_local):
    from profcallbacks.integrations.mlflow_run import MlflowSink

    with mlflow_local.start_run() as run:
        findings = plain_loop(tmp_path / "log", SleepyDataset(0.0), STEPS,
                              {**RUN_OPTIONS, "metrics_sink": MlflowSink()})
    client = mlflow_local.MlflowClient()
    times = mlflow_metric(client, run.info.run_id, STEP_TIME)
    assert steps_of(times) == [1, 3, 5, 7] and plausible_step_times(times)
    assert mlflow_metric(client, run.info.run_id, SYNC_COUNT) == expected_counts(findings)
    written = mlflow_findings(client, run.info.run_id, tmp_path / "dl")
    assert sync_rows(findings) and written == [f.to_dict() for f in findings]


CAPTURING = {**RUN_OPTIONS, "schedule": Schedule(skip_first=2, warmup=0, active=2, repeat=1)}


def _verdict(findings):
    verdicts = [f for f in findings if f.kind == "capture_verdict"]
    assert len(verdicts) == 1, [(f.kind, f.step, f.details.get("capture")) for f in findings]
    return verdicts[0].details


@pytest.mark.parametrize("log_captures", [True, False])
def test_wandb_gets_each_capture_as_a_profile_artifact_and_its_verdict(tmp_path, wandb_offline,
                                                                      log_captures):
    from profcallbacks.integrations.wandb_run import WandbSink

    run = wandb_offline.init(dir=str(tmp_path))
    findings = plain_loop(tmp_path / "log", SleepyDataset(0.0), STEPS,
                          {**CAPTURING, "metrics_sink": WandbSink(run, log_captures=log_captures)})
    run.finish()
    wandb_offline.teardown()
    run_dir = wandb_run_dir(tmp_path)
    verdict = _verdict(findings)
    capture = tmp_path / "log" / verdict["capture"]
    assert wandb_summary(run_dir)["profcallbacks/verdict"].startswith(f"{verdict['capture']}: "
                                                                      f"{verdict['kind']} (")
    artifacts = [a for a in wandb_artifacts(run_dir) if a["type"] == "profile"]
    if not log_captures:
        assert artifacts == []
        return
    (artifact,) = artifacts
    assert artifact["name"] == f"profcallbacks-{verdict['capture']}" and artifact["type"] == "profile"
    assert artifact["files"] == sorted(p.name for p in capture.iterdir()) != []


def test_mlflow_gets_each_capture_as_artifacts_and_its_verdict_as_a_tag(tmp_path, mlflow_local):
    from profcallbacks.integrations.mlflow_run import MlflowSink

    with mlflow_local.start_run() as run:
        findings = plain_loop(tmp_path / "log", SleepyDataset(0.0), STEPS,
                              {**CAPTURING, "metrics_sink": MlflowSink()})
    client = mlflow_local.MlflowClient()
    verdict = _verdict(findings)
    tags = client.get_run(run.info.run_id).data.tags
    assert tags["profcallbacks/verdict"].startswith(f"{verdict['capture']}: {verdict['kind']} (")
    logged = client.list_artifacts(run.info.run_id, f"profcallbacks/captures/{verdict['capture']}")
    capture = tmp_path / "log" / verdict["capture"]
    assert sorted(Path(a.path).name for a in logged) == sorted(p.name for p in capture.iterdir()) != []


def test_lightning_csv_logger_gets_scalars_and_finding_counts(tmp_path):
    pytest.importorskip("lightning")
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="run")
    findings = lightning_trainer(tmp_path / "log", SleepyDataset(0.0), STEPS, RUN_OPTIONS,
                                 logger=logger)
    rows = csv_rows(logger.experiment.metrics_file_path)
    times = [(int(r["step"]), float(r[STEP_TIME])) for r in rows if r.get(STEP_TIME)]
    assert steps_of(times) == [1, 3, 5, 7] and plausible_step_times(times)
    counts = [(int(r["step"]), float(r[SYNC_COUNT])) for r in rows if r.get(SYNC_COUNT)]
    assert sync_rows(findings) and counts == expected_counts(findings)


def test_lightning_wandb_and_mlflow_loggers_get_findings_as_table_and_artifact(
        tmp_path, wandb_offline, mlflow_local):
    pytest.importorskip("lightning")
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    wandb_logger = WandbLogger(save_dir=str(tmp_path), offline=True)
    mlflow_logger = MLFlowLogger(experiment_name="pc", tracking_uri=mlflow_local.get_tracking_uri(),
                                 artifact_location=str(tmp_path / "artifacts"))
    findings = lightning_trainer(tmp_path / "log", SleepyDataset(0.0), STEPS, CAPTURING,
                                 logger=[wandb_logger, mlflow_logger])
    wandb_offline.finish()
    wandb_offline.teardown()
    run_dir = wandb_run_dir(tmp_path)
    rows = wandb_history(run_dir)
    times = series(rows, STEP_TIME, "trainer/global_step")
    assert steps_of(times) == [1, 3, 5, 7] and plausible_step_times(times)
    assert series(rows, SYNC_COUNT, "trainer/global_step") == expected_counts(findings)
    table = wandb_table(run_dir, rows, "profcallbacks/findings")
    assert sync_rows(findings) and [r[2] for r in table["data"]] == [f.kind for f in findings]
    client, run_id = mlflow_logger.experiment, mlflow_logger.run_id
    assert steps_of(mlflow_metric(client, run_id, STEP_TIME)) == [1, 3, 5, 7]
    assert mlflow_metric(client, run_id, SYNC_COUNT) == expected_counts(findings)
    assert mlflow_findings(client, run_id, tmp_path / "dl") == [f.to_dict() for f in findings]
    verdict = _verdict(findings)  # the capture: its verdict and its files in both trackers
    files = sorted(p.name for p in (tmp_path / "log" / verdict["capture"]).iterdir())
    label = f"{verdict['capture']}: {verdict['kind']} ("
    assert client.get_run(run_id).data.tags["profcallbacks/verdict"].startswith(label)
    logged = client.list_artifacts(run_id, f"profcallbacks/captures/{verdict['capture']}")
    assert sorted(Path(a.path).name for a in logged) == files != []
    assert wandb_summary(run_dir)["profcallbacks/verdict"].startswith(label)
    (artifact,) = [a for a in wandb_artifacts(run_dir) if a["type"] == "profile"]
    assert artifact["files"] == files


def test_hf_report_to_wandb_and_mlflow_get_scalars_and_findings(tmp_path, wandb_offline,
                                                                 mlflow_local):
    pytest.importorskip("transformers")
    from profcallbacks.integrations.wandb_run import STEP_KEY

    findings = hf_trainer(tmp_path / "log", SleepyDataset(0.0), STEPS, RUN_OPTIONS,
                          report_to=["wandb", "mlflow"], logging_steps=2)
    run_id = mlflow_local.last_active_run().info.run_id
    wandb_offline.finish()
    wandb_offline.teardown()  # the W&B service has written the whole run file when this returns
    run_dir = wandb_run_dir(tmp_path)
    rows = wandb_history(run_dir)
    times = series(rows, STEP_TIME, STEP_KEY)
    assert steps_of(times) == [1, 3, 5, 7] and plausible_step_times(times)
    assert series(rows, SYNC_COUNT, STEP_KEY) == expected_counts(findings)
    table = wandb_table(run_dir, rows, "profcallbacks/findings")
    assert sync_rows(findings) and [r[2] for r in table["data"]] == [f.kind for f in findings]
    client = mlflow_local.MlflowClient()
    assert steps_of(mlflow_metric(client, run_id, STEP_TIME)) == [1, 3, 5, 7]
    assert mlflow_metric(client, run_id, SYNC_COUNT) == expected_counts(findings)
    assert mlflow_findings(client, run_id, tmp_path / "dl") == [f.to_dict() for f in findings]


def test_only_the_enabled_integrations_are_imported():
    code = ("import sys; from profcallbacks.integrations.report_to import report_to_sinks; "
            "import profcallbacks.loop; assert report_to_sinks(['tensorboard', 'none']) == []; "
            "print(sorted(m for m in ('wandb', 'mlflow', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_package_names_the_extra(monkeypatch):
    from profcallbacks.integrations.mlflow_run import MlflowSink
    from profcallbacks.integrations.wandb_run import WandbSink

    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"pip install 'profcallbacks\[wandb\]'"):
        WandbSink()
    with pytest.raises(ImportError, match=r"pip install 'profcallbacks\[mlflow\]'"):
        MlflowSink()


def test_no_open_run_and_a_bad_sink_are_refused_at_construction(tmp_path, wandb_offline,
                                                                mlflow_local):
    from profcallbacks.integrations.mlflow_run import MlflowSink
    from profcallbacks.integrations.wandb_run import WandbSink

    with pytest.raises(ValueError, match=r"wandb.init"):
        WandbSink()
    with pytest.raises(ValueError, match=r"mlflow.start_run"):
        MlflowSink()
    with pytest.raises(ValueError, match=r"metrics_sink.*WandbSink"):
        StepProfiler(tmp_path, metrics_sink="wandb")


def test_the_tracker_example_runs_with_both_trackers(tmp_path, wandb_offline, mlflow_local):
    import runpy

    example = runpy.run_path(str(EXAMPLES / "tracker_loop.py"))
    example["main"](["--tracker", "mlflow", "--logdir", str(tmp_path / "m"), "--steps", "30"])
    run = mlflow_local.last_active_run()
    client = mlflow_local.MlflowClient()
    assert steps_of(mlflow_metric(client, run.info.run_id, STEP_TIME)) == [4, 9, 14, 19, 24, 29]
    assert any(f["kind"] == SYNC_POINT for f in mlflow_findings(client, run.info.run_id, tmp_path))
    example["main"](["--tracker", "wandb", "--logdir", str(tmp_path / "w"), "--steps", "30"])
    wandb_offline.teardown()
    rows = wandb_history(wandb_run_dir(tmp_path))
    assert steps_of(series(rows, STEP_TIME, "profcallbacks/step")) == [4, 9, 14, 19, 24, 29]
    assert series(rows, SYNC_COUNT, "profcallbacks/step")


def test_lightning_tensorboard_logger_gets_finding_texts(tmp_path):
    pytest.importorskip("lightning")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb", name="run")
    findings = lightning_trainer(None, SleepyDataset(0.0), STEPS, RUN_OPTIONS, logger=logger)
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    tag = f"profcallbacks/findings/{SYNC_POINT}/text_summary"
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
    assert sync_rows(findings) and [step for step, _ in texts] == [f.step for f in sync_rows(findings)]
    assert all(markdown_text(f.message) in text
               for f, (_, text) in zip(sync_rows(findings), texts, strict=True))
    assert [s.step for s in events.Scalars(STEP_TIME)] == [1, 3, 5, 7]  # through the logger, once


def test_finding_text_in_tensorboard_is_escaped_markdown(tmp_path):
    """TensorBoard renders text as Markdown: ``__getitem__`` must not turn bold, a link must not
    become one."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from profcallbacks.findings import Finding

    message = "slow __getitem__ in *dataset*: see [here](https://example.invalid)"
    finding = Finding("dataloader_stall", step=2, rank=0, severity="warning", message=message)
    with StepProfiler(tmp_path / "log", **{**OPTIONS, "tensorboard_scalars": True}) as prof:
        prof.session.emit(finding)
        for _ in range(3):
            prof.step()
    events = EventAccumulator(str(tmp_path / "log"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = [e.tensor_proto.string_val[0].decode()
               for e in events.Tensors("profcallbacks/findings/dataloader_stall/text_summary")]
    assert text == ("**warning** step 2 rank 0 `dataloader_stall`: slow \\_\\_getitem\\_\\_ in "
                    "\\*dataset\\*: see \\[here\\]\\(https://example.invalid\\)")


class RecordingRun:
    """A RunLog of the test's own: what a tracker backend would receive."""

    def __init__(self) -> None:
        self.scalars, self.findings, self.closed = [], [], 0

    def __call__(self, values, step):
        self.scalars.append((step, values[STEP_TIME]))

    def finding(self, finding):
        self.findings.append(finding)

    def close(self):
        self.closed += 1


@pytest.mark.parametrize("front_end", [lightning_trainer, hf_trainer], ids=["lightning", "hf"])
def test_callbacks_take_a_metrics_sink_too(tmp_path, front_end):
    run = RecordingRun()
    findings = front_end(tmp_path / "log", SleepyDataset(0.0), STEPS,
                         {**RUN_OPTIONS, "metrics_sink": run})
    assert steps_of(run.scalars) == [1, 3, 5, 7] and plausible_step_times(run.scalars)
    assert sync_rows(findings) and run.findings == findings and run.closed == 1


def _mlflow_capture(client, run_id, findings):
    """The verdict tag and the capture's logged files of an MLflow run."""
    verdict = _verdict(findings)
    logged = client.list_artifacts(run_id, f"profcallbacks/captures/{verdict['capture']}")
    return client.get_run(run_id).data.tags.get("profcallbacks/verdict", ""), verdict, logged


@pytest.mark.parametrize("front_end", ["plain", "lightning", "hf"])
def test_tracker_captures_false_logs_the_verdict_and_no_trace_files(tmp_path, mlflow_local,
                                                                    front_end):
    options = {**CAPTURING, "tracker_captures": False}
    if front_end == "plain":
        from profcallbacks.integrations.mlflow_run import MlflowSink

        with mlflow_local.start_run() as run:
            findings = plain_loop(tmp_path / "log", SleepyDataset(0.0), STEPS,
                                  {**options, "metrics_sink": MlflowSink()})
        client, run_id = mlflow_local.MlflowClient(), run.info.run_id
    elif front_end == "lightning":
        pytest.importorskip("lightning")
        from lightning.pytorch.loggers import MLFlowLogger

        logger = MLFlowLogger(experiment_name="pc", tracking_uri=mlflow_local.get_tracking_uri(),
                              artifact_location=str(tmp_path / "artifacts"))
        findings = lightning_trainer(tmp_path / "log", SleepyDataset(0.0), STEPS, options,
                                     logger=logger)
        client, run_id = logger.experiment, logger.run_id
    else:
        pytest.importorskip("transformers")
        findings = hf_trainer(tmp_path / "log", SleepyDataset(0.0), STEPS, options,
                              report_to=["mlflow"], logging_steps=2)
        client, run_id = mlflow_local.MlflowClient(), mlflow_local.last_active_run().info.run_id
    tag, verdict, logged = _mlflow_capture(client, run_id, findings)
    assert tag.startswith(f"{verdict['capture']}: {verdict['kind']} (")  # the verdict still goes
    assert logged == []  # the trace files do not
    assert any((tmp_path / "log" / verdict["capture"]).iterdir())  # (they are on disk)
