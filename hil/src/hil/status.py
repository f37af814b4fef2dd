"""Suite outcomes, how they are decided, and the process exit code they add up to.

PASS   the suite ran to the end and every test passed (or was skipped).
FAIL   tests ran and some failed; a crash (segfault) or OOM kill inside a test is a FAIL too:
       the code under test did it, and the step's report says which.
HANG   the outer watchdog killed the container (or process group): nothing inside stopped it.
ERROR  infrastructure: daemon unreachable, image build failed, container did not start or
       exited before the suite started, results could not be read.
NOT_RUN  not attempted: the target is quarantined or an earlier suite on it hung.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Optional


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    HANG = "HANG"
    ERROR = "ERROR"
    NOT_RUN = "NOT_RUN"


EXIT_OK = 0
EXIT_TEST_FAILURES = 1
EXIT_HANG_OR_INFRA = 2


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.passed + other.passed,
            self.failed + other.failed,
            self.errors + other.errors,
            self.skipped + other.skipped,
        )


@dataclass
class RunOutcome:
    """What an executor saw of one container / process run.

    ``started``: the suite runner inside wrote its start marker. ``exit_code`` is None when the
    run was killed or never started. ``infra_error`` is set when the executor itself failed.
    """

    started: bool = False
    exit_code: Optional[int] = None
    watchdog_fired: bool = False
    oom_killed: bool = False
    infra_error: str = ""
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass
class SuiteResult:
    target: str
    suite: str
    status: Status
    counts: Counts = field(default_factory=Counts)
    duration_s: float = 0.0
    detail: str = ""
    artifacts: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def classify(outcome: RunOutcome, counts: Counts, steps_failed: Iterable[str] = ()) -> tuple:
    """``(Status, detail)`` for one run, from the executor's view and the suite's reports."""
    steps_failed = list(steps_failed)
    if outcome.watchdog_fired:
        return Status.HANG, "watchdog killed the run after its suite timeout"
    if outcome.infra_error:
        return Status.ERROR, outcome.infra_error
    if not outcome.started:
        return Status.ERROR, f"exited (code {outcome.exit_code}) before the suite started"
    oom = " (OOM-killed under the memory limit)" if outcome.oom_killed else ""
    if counts.failed or counts.errors or steps_failed:
        names = f" in steps {', '.join(steps_failed)}" if steps_failed else ""
        return Status.FAIL, f"{counts.failed + counts.errors} failing tests{names}{oom}"
    if outcome.exit_code != 0:
        return Status.FAIL, f"suite runner exited with code {outcome.exit_code}{oom}"
    if outcome.oom_killed:
        return Status.FAIL, oom.strip(" ()")
    return Status.PASS, ""


def exit_code(results: Iterable[SuiteResult]) -> int:
    """0 when all passed, 2 on any hang/infrastructure error/not run, else 1 on failures."""
    statuses = {r.status for r in results}
    if statuses & {Status.HANG, Status.ERROR, Status.NOT_RUN}:
        return EXIT_HANG_OR_INFRA
    if Status.FAIL in statuses:
        return EXIT_TEST_FAILURES
    return EXIT_OK
