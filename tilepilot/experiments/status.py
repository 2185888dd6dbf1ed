"""Result statuses (DESIGN.md, "Statuses")."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    OUT_OF_RESOURCES = "out_of_resources"
    WRONG_RESULT = "wrong_result"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    OOM = "oom"
    INVALID = "invalid"
    POISON = "poison"

    @property
    def never_runs(self) -> bool:
        """True when the config can never give a valid timing for this problem.

        Told to Optuna as a violated constraint (TPE ignores FAIL trials and would keep
        proposing the config). `timeout` and `oom` may pass on another try: told as FAIL.
        """
        return self not in (Status.OK, Status.TIMEOUT, Status.OOM)

    @property
    def counts_against_budget(self) -> bool:
        """Every config that was dispatched counts; `invalid` ones were never launched."""
        return self is not Status.INVALID
