"""Classification of runs and the exit code of a whole run."""

from __future__ import annotations

import pytest

from hil.status import Counts, RunOutcome, Status, SuiteResult, classify, exit_code


@pytest.mark.parametrize(
    "outcome, counts, failed_steps, want",
    [
        (RunOutcome(started=True, exit_code=0), Counts(passed=3), [], Status.PASS),
        (RunOutcome(started=True, exit_code=1), Counts(passed=2, failed=1), ["a"], Status.FAIL),
        (RunOutcome(started=True, exit_code=1), Counts(passed=3), [], Status.FAIL),
        (RunOutcome(started=True, exit_code=0, oom_killed=True), Counts(passed=1), [], Status.FAIL),
        (RunOutcome(started=True, watchdog_fired=True), Counts(passed=5), [], Status.HANG),
        # a hang that also left failures behind is still a hang: nothing inside stopped it
        (RunOutcome(started=True, watchdog_fired=True), Counts(failed=1), ["a"], Status.HANG),
        (RunOutcome(started=False, exit_code=127), Counts(), [], Status.ERROR),
        (RunOutcome(infra_error="daemon gone"), Counts(passed=1), [], Status.ERROR),
        (RunOutcome(started=True, exit_code=0), Counts(passed=1, errors=1), [], Status.FAIL),
        (RunOutcome(started=True, exit_code=0), Counts(skipped=4), [], Status.PASS),
    ],
)
def test_classify(outcome, counts, failed_steps, want):
    status, detail = classify(outcome, counts, failed_steps)
    assert status == want
    assert (detail == "") == (want == Status.PASS)


def test_oom_and_early_exit_details():
    _, detail = classify(
        RunOutcome(started=True, exit_code=1, oom_killed=True), Counts(failed=1), ["hog"]
    )
    assert "OOM" in detail and "hog" in detail
    _, detail = classify(RunOutcome(started=False, exit_code=1), Counts(), [])
    assert "before the suite started" in detail


def result(status: Status) -> SuiteResult:
    return SuiteResult("t", "s", status)


@pytest.mark.parametrize(
    "statuses, code",
    [
        ([Status.PASS, Status.PASS], 0),
        ([], 0),
        ([Status.PASS, Status.FAIL], 1),
        ([Status.FAIL, Status.HANG], 2),
        ([Status.PASS, Status.ERROR], 2),
        ([Status.NOT_RUN], 2),
    ],
)
def test_exit_code(statuses, code):
    assert exit_code([result(s) for s in statuses]) == code
