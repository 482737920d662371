import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# The processes the tests start get Ctrl-C as from a terminal, whatever started the suite: a shell
# that runs a command in the background without job control (`cmd &` in a script, `nohup`) has
# it ignore SIGINT, which its children inherit, and Python then installs no KeyboardInterrupt
# (a `watch` or a training child would never see the tests' SIGINT). A handled signal is reset
# to its default in each child at exec.
signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared machine intra-op threads wait on each other for
    milliseconds per op, so step times are steadier with one. Modules that time steps use it
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


FAST_MODULES = {
    # detectors, options and the package's shape, on generated or recorded step times
    "test_block_detectors.py", "test_slowdown.py", "test_slowdown_early.py", "test_stall.py",
    "test_stall_hold.py", "test_straggler.py", "test_sync_unit.py", "test_options.py",
    "test_schedule.py", "test_front_ends.py", "test_layout.py", "test_device_timing.py",
    "test_deprecations.py", "test_architecture_doc.py", "test_declared_ranges.py", "test_fast_lane.py",
    "test_session_size.py",
    # the report and watch on stored traces and files
    "test_verdicts.py", "test_verdicts_hold.py", "test_diagnoses.py", "test_report_decode.py",
    "test_report_generations.py", "test_findings_track.py", "test_watch_hostile.py",
    # the documentation's catalogue and links (its code examples run real loops: not fast)
    "test_docs.py",
}
"""Modules of pure-logic tests: the fast lane (``pytest -m fast``, ``scripts/test.sh --fast``)
takes them and every docstring example, except the tests below."""
NOT_FAST = {
    # real training loops, sleeping loaders, co-tenants, several processes
    "tests/test_docs.py::test_code_examples_run",
    "tests/test_options.py::test_raising_detector_hooks_warn_once_and_never_reach_the_loop",
    "tests/test_slowdown.py::test_a_slow_burst_is_alerted_only_when_it_lasts_min_duration_s",
    "tests/test_slowdown.py::test_steady_loop_on_a_jittery_machine_never_alerts",
    "tests/test_slowdown_early.py::test_a_co_tenant_making_steps_10x_slower_from_step_50_is_alerted_within_budget",
    "tests/test_slowdown_early.py::test_no_such_line_when_the_captured_steps_are_typical",
    "tests/test_slowdown_early.py::test_the_headline_says_when_most_steps_were_far_slower_than_the_captured_ones",
    "tests/test_stall.py::test_bursty_multiworker_loader_is_flagged_with_fitting_advice",
    "tests/test_stall.py::test_loader_at_30_percent_is_flagged_within_50_steps_once",
    "tests/test_stall.py::test_loader_at_5_percent_or_less_is_never_flagged",
    "tests/test_stall.py::test_logged_stall_says_its_kind_once",
    "tests/test_stall.py::test_median_of_blocks_ignores_a_single_huge_hiccup_in_the_window",
    "tests/test_stall.py::test_real_loop_with_sleeping_loader",
    "tests/test_stall.py::test_stall_episode_clears_with_a_note_and_a_new_episode_is_a_new_finding",
    "tests/test_stall.py::test_steady_fast_loader_on_real_short_steps_is_never_a_stall",
    "tests/test_stall_hold.py::test_a_real_half_wait_is_flagged_within_the_hold_and_a_second",
    "tests/test_stall_hold.py::test_steady_loops_beside_a_bursty_co_tenant_raise_no_stall",
    "tests/test_straggler.py::test_two_process_gloo_run_flags_the_slow_rank",
    "tests/test_verdicts_hold.py::test_gloo_ddp_with_heavy_all_reduce_is_communication_bound",
    "tests/test_verdicts_hold.py::test_stall_finding_and_verdict_share_one_piece_of_advice",
    # traces of tens of MB read in full
    "tests/test_diagnoses.py::test_real_traces_get_exactly_the_expert_diagnoses",
    "tests/test_report_generations.py::test_an_old_trace_renamed_to_torch_2_reads_the_same",
    "tests/test_report_generations.py::test_hta_breakdown_holds_on_the_old_format",
    "tests/test_report_generations.py::test_real_torch_1_9_traces_get_the_verdicts_of_their_runs",
    "tests/test_verdicts.py::test_host_side_numbers_per_step",
    # docstring examples that open a session with its export helper
    "src/profcallbacks/capture/exporter.py::profcallbacks.capture.exporter.TraceExporter",
    "src/profcallbacks/run/session.py::profcallbacks.run.session.ProfilingSession",
    "src/profcallbacks/testing.py::profcallbacks.testing",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the fast lane: the pure-logic tests (:data:`FAST_MODULES`) and the docstring
    examples, less :data:`NOT_FAST` and anything marked ``slow``."""
    fast = pytest.mark.fast
    for item in items:
        module = item.path.name
        doctest = item.path.suffix == ".py" and "src" in item.path.parts
        if ((module in FAST_MODULES or doctest) and item.nodeid.split("[")[0] not in NOT_FAST
                and item.get_closest_marker("slow") is None):
            item.add_marker(fast)
