"""The exception hierarchy. The CLI turns an `InputError` into one line on stderr and exit 2."""

from __future__ import annotations


class TilepilotError(Exception):
    """Base of every error tilepilot raises on purpose."""


class InputError(TilepilotError):
    """The user's input is wrong: a campaign file, a flag, a dataset. Exit code 2.

    The message is one line that names the bad value and what is allowed.
    """


class CampaignError(InputError):
    """A campaign file that cannot be loaded or validated."""


class DatasetError(InputError):
    """A replay dataset that cannot be read or does not fit the campaign."""


class BackendUnavailable(InputError):
    """The backend asked for cannot run here (no GPU, bf16 under the interpreter, ...)."""
