"""`Campaign`: a TOML file naming a kernel, its problems, a proposer and a budget.

Validation is complete at load time: every mistake becomes one `CampaignError` line that names
the bad key or value and what is allowed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tilepilot.experiments.errors import CampaignError, InputError
from tilepilot.experiments.values import Problem

ProblemParser = Callable[[Mapping[str, Any]], Problem]

CAMPAIGN_KEYS = {
    "name": "a name of letters, digits, '.', '_' and '-'",
    "kernel": "a registered kernel family",
    "proposer": "a proposer name",
    "members": 'with proposer = "portfolio": the proposers it splits each round among (distinct names)',
    "budget": "distinct configs to measure per problem (1 to 100000)",
    "seed": "an integer from 0 to 4294967295",
    "description": "free text",
    "hypothesis_share": "the share of each problem's budget for experiments that test hypotheses (0 to 0.5)",
}
TOP_KEYS = ("campaign", "problems", "space", "configs")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class Campaign:
    name: str
    kernel: str
    proposer: str
    budget: int
    seed: int
    problems: tuple[Problem, ...]  # empty: take every problem of the replay dataset
    description: str = ""
    source: str = ""  # the TOML text as loaded, kept with the campaign row
    # [space]: parameter -> the choices to search (a subset of the family's); checked by the
    # planner against the kernel's space, since only it knows the space
    space: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    # [[configs]]: configs to measure first (e.g. the one in production today), as given
    configs: tuple[tuple[tuple[str, Any], ...], ...] = ()
    hypothesis_share: float = 0.1  # of each problem's budget, for hypothesis experiments
    members: tuple[str, ...] = ()  # the portfolio's members (empty: its defaults)

    def with_problems(self, problems: Sequence[Problem]) -> Campaign:
        return replace(self, problems=tuple(problems))


def load_campaign(
    path: str | Path,
    *,
    kernels: Mapping[str, ProblemParser],
    proposers: Sequence[str],
    default_proposer: str = "optuna",
) -> Campaign:
    """Read and validate a campaign file.

    `kernels` maps each known kernel name to the function that checks one `[[problems]]`
    table (raising InputError); `proposers` lists the known proposer names.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark is not TOML's business
    except FileNotFoundError:
        raise CampaignError(f"campaign file {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise CampaignError(f"campaign file {str(p)!r} is a directory") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CampaignError(f"campaign file {str(p)!r} cannot be read: {e}") from None
    return parse_campaign(text, kernels=kernels, proposers=proposers,
                          default_proposer=default_proposer, origin=str(p))


def parse_campaign(
    text: str,
    *,
    kernels: Mapping[str, ProblemParser],
    proposers: Sequence[str],
    default_proposer: str = "optuna",
    origin: str = "<campaign>",
) -> Campaign:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CampaignError(f"{origin}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise CampaignError(f"{origin}: unknown table {unknown[0]!r} (allowed: {', '.join(TOP_KEYS)})")
    head = data.get("campaign")
    if not isinstance(head, dict):
        raise CampaignError(f"{origin}: missing [campaign] table")
    unknown = sorted(set(head) - set(CAMPAIGN_KEYS))
    if unknown:
        raise CampaignError(
            f"{origin}: unknown key campaign.{unknown[0]} (allowed: {', '.join(CAMPAIGN_KEYS)})")

    name = _required(head, "name", str, origin)
    if not NAME_RE.match(name):
        raise CampaignError(f"{origin}: campaign.name={name!r} is not {CAMPAIGN_KEYS['name']}")
    kernel = _required(head, "kernel", str, origin)
    if kernel not in kernels:
        raise CampaignError(
            f"{origin}: unknown kernel {kernel!r} (known kernels: {', '.join(sorted(kernels))})")
    proposer = head.get("proposer", default_proposer)
    if not isinstance(proposer, str) or proposer not in proposers:
        raise CampaignError(
            f"{origin}: unknown proposer {proposer!r} (known proposers: {', '.join(proposers)})")
    members = _members(head, proposer, proposers, origin)
    budget = _required(head, "budget", int, origin)
    if not 1 <= budget <= 100_000:
        raise CampaignError(f"{origin}: campaign.budget={budget} is not {CAMPAIGN_KEYS['budget']}")
    seed = head.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise CampaignError(f"{origin}: campaign.seed={seed!r} is not {CAMPAIGN_KEYS['seed']}")
    description = head.get("description", "")
    if not isinstance(description, str) or len(description) > 2000:
        raise CampaignError(f"{origin}: campaign.description must be text of at most 2000 characters")

    raw_problems = data.get("problems", [])
    if not isinstance(raw_problems, list) or not all(isinstance(x, dict) for x in raw_problems):
        raise CampaignError(f"{origin}: 'problems' must be an array of tables ([[problems]])")
    if len(raw_problems) > 1000:
        raise CampaignError(f"{origin}: {len(raw_problems)} problems (at most 1000 allowed)")
    problems: list[Problem] = []
    for i, raw in enumerate(raw_problems, start=1):
        try:
            problem = kernels[kernel](raw)
        except InputError as e:
            raise CampaignError(f"{origin}: problem {i}: {e}") from None
        if problem in problems:
            raise CampaignError(f"{origin}: problem {i} ({problem.label()}) is listed twice")
        problems.append(problem)
    share = head.get("hypothesis_share", 0.1)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 0.5:
        raise CampaignError(f"{origin}: campaign.hypothesis_share={share!r} is not "
                            f"{CAMPAIGN_KEYS['hypothesis_share']}")
    space = _space(data.get("space", {}), origin)
    configs = _configs(data.get("configs", []), origin)
    return Campaign(name, kernel, proposer, budget, seed, tuple(problems), description, text, space, configs,
                    float(share), members)


def _members(head: Mapping[str, Any], proposer: str, proposers: Sequence[str], origin: str) -> tuple[str, ...]:
    """campaign.members: the portfolio's member proposers, each a known proposer named once."""
    if "members" not in head:
        return ()
    raw = head["members"]
    if proposer != "portfolio":
        raise CampaignError(f"{origin}: campaign.members is for proposer = \"portfolio\", not {proposer!r}")
    if not isinstance(raw, list) or not raw or not all(isinstance(m, str) for m in raw):
        raise CampaignError(f"{origin}: campaign.members={raw!r} is not a non-empty list of proposer names")
    allowed = [p for p in proposers if p != "portfolio"]
    for m in raw:
        if m not in allowed:
            raise CampaignError(f"{origin}: unknown portfolio member {m!r} in campaign.members "
                                f"(allowed: {', '.join(allowed)})")
    if len(set(raw)) != len(raw):
        twice = next(m for m in raw if raw.count(m) > 1)
        raise CampaignError(f"{origin}: portfolio member {twice!r} is named twice in campaign.members")
    return tuple(raw)


def _space(raw: Any, origin: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    if not isinstance(raw, dict):
        raise CampaignError(f"{origin}: [space] must be a table of parameter = [choices]")
    out = []
    for name, choices in raw.items():
        if not isinstance(choices, list) or not choices or len(choices) > 1000:
            raise CampaignError(f"{origin}: space.{name} must be a non-empty list of choices")
        if any(isinstance(c, dict | list) for c in choices):
            raise CampaignError(f"{origin}: space.{name} holds a table or list; choices are numbers or text")
        out.append((name, tuple(choices)))
    return tuple(out)


def _configs(raw: Any, origin: str) -> tuple[tuple[tuple[str, Any], ...], ...]:
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        raise CampaignError(f"{origin}: 'configs' must be an array of tables ([[configs]])")
    if len(raw) > 1000:
        raise CampaignError(f"{origin}: {len(raw)} configs (at most 1000 allowed)")
    return tuple(tuple(c.items()) for c in raw)


def _required(table: Mapping[str, Any], key: str, kind: type, origin: str) -> Any:
    if key not in table:
        raise CampaignError(f"{origin}: missing campaign.{key} ({CAMPAIGN_KEYS[key]})")
    value = table[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CampaignError(
            f"{origin}: campaign.{key}={value!r} is not {CAMPAIGN_KEYS[key]}")
    return value
