"""Malformed and hostile input through the command line: exit code 2, one line on stderr that
starts with "tilepilot: error:" and names the bad value, no traceback, and nothing written (no
database created, an existing one unchanged, byte for byte)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.replay_fixture import write_campaign, write_dataset
from tilepilot.cli import main

REPO = Path(__file__).resolve().parents[1]
Content = str | bytes

# ---- building campaign files -------------------------------------------------------------------
HEAD = {"name": '"bad"', "kernel": '"matmul"', "proposer": '"random"', "budget": "4", "seed": "1"}
PROBLEM = {"M": "512", "N": "512", "K": "512", "dtype": '"fp16"'}
CONFIG = {"BLOCK_SIZE_M": "64", "BLOCK_SIZE_N": "64", "BLOCK_SIZE_K": "32", "GROUP_SIZE_M": "8",
          "num_warps": "4", "num_stages": "3"}


def table(header: str, values: dict[str, str | None], **changes: str | None) -> str:
    merged = {**values, **changes}
    return header + "\n" + "".join(f"{k} = {v}\n" for k, v in merged.items() if v is not None)


def camp(body: str = "", *, top: str = "", **head: str | None) -> str:
    """A campaign file: `top` before [campaign], the [campaign] table (with changes), then `body`."""
    return top + table("[campaign]", HEAD, **head) + body


def problem(**changes: str | None) -> str:
    return table("[[problems]]", PROBLEM, **changes)


def config(**changes: str | None) -> str:
    return table("[[configs]]", CONFIG, **changes)


def space(line: str) -> str:
    return "[space]\n" + line + "\n"


CAMPAIGNS: dict[str, tuple[Content, str]] = {
    # not TOML, or not text
    "toml_unclosed_table": ("[campaign\nname = 'x'\n", "not valid TOML"),
    "toml_missing_value": (camp().replace("budget = 4", "budget ="), "not valid TOML"),
    "toml_duplicate_key": (camp('name = "again"\n'), "not valid TOML"),
    "toml_duplicate_table": (camp("[campaign]\nseed = 2\n"), "not valid TOML"),
    "toml_unterminated_string": ('[campaign]\nname = "bad\n', "not valid TOML"),
    "toml_bare_words": ("this is not toml at all\n", "not valid TOML"),
    "json_instead_of_toml": ('{"campaign": {"name": "x"}}\n', "not valid TOML"),
    "yaml_instead_of_toml": ("campaign:\n  name: x\n", "not valid TOML"),
    "nul_bytes": (b"\x00" * 64, "not valid TOML"),
    "binary_junk": (bytes(range(256)) * 4, "cannot be read"),
    "utf16_text": (camp().encode("utf-16"), "cannot be read"),
    "latin1_text": (camp(name='"caf\xe9"').encode("latin-1"), "cannot be read"),
    "empty_file": ("", "missing [campaign]"),
    "comments_only": ("# nothing here\n", "missing [campaign]"),
    "whitespace_only": (" \n\t\n", "missing [campaign]"),
    # structure
    "campaign_is_a_number": ("campaign = 5\n", "missing [campaign]"),
    "campaign_array_of_tables": ("[[campaign]]\nname = 'x'\n", "missing [campaign]"),
    "unknown_table": (camp("[extras]\na = 1\n"), "'extras'"),
    "unknown_campaign_key": (camp(colour='"red"'), "campaign.colour"),
    "unknown_campaign_key_unicode": (camp(**{'"ключ💥"': "1"}), "ключ💥"),
    # name
    "name_missing": (camp(name=None), "campaign.name"),
    "name_number": (camp(name="5"), "campaign.name=5"),
    "name_empty": (camp(name='""'), "campaign.name=''"),
    "name_with_spaces": (camp(name='"my campaign"'), "'my campaign'"),
    "name_sql": (camp(name='"x\'; DROP TABLE campaigns; --"'), "DROP TABLE campaigns"),
    "name_html": (camp(name='"<script>alert(1)</script>"'), "<script>alert(1)</script>"),
    "name_unicode": (camp(name='"ünïcødé💥"'), "ünïcødé💥"),
    "name_too_long": (camp(name='"' + "a" * 101 + '"'), "a" * 101),
    "name_newline": (camp(name='"a\\nb"'), "'a\\nb'"),
    "name_path_traversal": (camp(name='"../../etc/passwd"'), "../../etc/passwd"),
    "name_leading_dash": (camp(name='"-rf"'), "'-rf'"),
    "name_control_char": (camp(name='"a\\u0007b"'), "'a\\x07b'"),
    "name_rtl_override": (camp(name='"abc\\u202edef"'), "'abc\\u202edef'"),
    "name_array": (camp(name='["a"]'), "campaign.name=['a']"),
    "name_table": (camp(name="{ x = 1 }"), "campaign.name={'x': 1}"),
    "name_bool": (camp(name="true"), "campaign.name=True"),
    # kernel
    "kernel_missing": (camp(kernel=None), "campaign.kernel"),
    "kernel_unknown": (camp(kernel='"conv2d"'), "'conv2d'"),
    "kernel_number": (camp(kernel="7"), "campaign.kernel=7"),
    "kernel_empty": (camp(kernel='""'), "kernel ''"),
    "kernel_sql": (camp(kernel='"matmul; DROP TABLE experiments"'), "DROP TABLE experiments"),
    "kernel_html": (camp(kernel='"<b>matmul</b>"'), "<b>matmul</b>"),
    "kernel_wrong_case": (camp(kernel='"MATMUL"'), "'MATMUL'"),
    "kernel_array": (camp(kernel='["matmul"]'), "['matmul']"),
    # proposer
    "proposer_unknown": (camp(proposer='"nope"'), "'nope'"),
    "proposer_number": (camp(proposer="3"), "proposer 3"),
    "proposer_array": (camp(proposer='["grid"]'), "['grid']"),
    "proposer_html": (camp(proposer='"<img src=x onerror=alert(1)>"'), "<img src=x onerror=alert(1)>"),
    "proposer_empty": (camp(proposer='""'), "proposer ''"),
    "proposer_wrong_case": (camp(proposer='"GRID"'), "'GRID'"),
    # budget
    "budget_missing": (camp(budget=None), "campaign.budget"),
    "budget_zero": (camp(budget="0"), "campaign.budget=0"),
    "budget_negative": (camp(budget="-3"), "campaign.budget=-3"),
    "budget_above_limit": (camp(budget="100001"), "campaign.budget=100001"),
    "budget_int64_max": (camp(budget="9223372036854775807"), "9223372036854775807"),
    "budget_beyond_int64": (camp(budget="99999999999999999999999"), "99999999999999999999999"),
    "budget_float": (camp(budget="5.0"), "campaign.budget=5.0"),
    "budget_text": (camp(budget='"5"'), "campaign.budget='5'"),
    "budget_bool": (camp(budget="true"), "campaign.budget=True"),
    "budget_inf": (camp(budget="inf"), "campaign.budget=inf"),
    "budget_nan": (camp(budget="nan"), "campaign.budget=nan"),
    "budget_array": (camp(budget="[5]"), "campaign.budget=[5]"),
    # seed
    "seed_text": (camp(seed='"1"'), "campaign.seed='1'"),
    "seed_float": (camp(seed="1.5"), "campaign.seed=1.5"),
    "seed_bool": (camp(seed="false"), "campaign.seed=False"),
    "seed_array": (camp(seed="[1]"), "campaign.seed=[1]"),
    "seed_negative_for_optuna": (camp(seed="-1", proposer='"optuna"'), "-1"),
    "seed_above_2_32_for_optuna": (camp(seed="4294967296", proposer='"optuna"'), "4294967296"),
    "seed_beyond_int64": (camp(seed="99999999999999999999"), "99999999999999999999"),
    # description
    "description_number": (camp(description="5"), "campaign.description"),
    "description_too_long": (camp(description='"' + "x" * 2001 + '"'), "campaign.description"),
    "description_array": (camp(description='["a"]'), "campaign.description"),
    # problems
    "problems_number": (camp(top="problems = 5\n"), "'problems'"),
    "problems_array_of_numbers": (camp(top="problems = [1, 2]\n"), "'problems'"),
    "problems_text": (camp(top='problems = "M=512"\n'), "'problems'"),
    "problem_missing_M": (camp(problem(M=None)), "missing M"),
    "problem_M_zero": (camp(problem(M="0")), "M=0"),
    "problem_M_negative": (camp(problem(M="-1")), "M=-1"),
    "problem_M_above_limit": (camp(problem(M="65537")), "M=65537"),
    "problem_M_huge": (camp(problem(M="1000000000000")), "M=1000000000000"),
    "problem_M_beyond_int64": (camp(problem(M="99999999999999999999")), "M=99999999999999999999"),
    "problem_M_float": (camp(problem(M="512.0")), "M=512.0"),
    "problem_M_text": (camp(problem(M='"512"')), "M='512'"),
    "problem_M_bool": (camp(problem(M="true")), "M=True"),
    "problem_M_inf": (camp(problem(M="inf")), "M=inf"),
    "problem_M_table": (camp(problem(M="{ a = 1 }")), "M={'a': 1}"),
    "problem_dtype_unknown": (camp(problem(dtype='"fp8"')), "'fp8'"),
    "problem_dtype_fp32": (camp(problem(dtype='"fp32"')), "'fp32'"),
    "problem_dtype_number": (camp(problem(dtype="16")), "dtype=16"),
    "problem_dtype_missing": (camp(problem(dtype=None)), "dtype=None"),
    "problem_dtype_html": (camp(problem(dtype='"<script>"')), "'<script>'"),
    "problem_unknown_key": (camp(problem(Q="1")), "'Q'"),
    "problem_unknown_key_unicode": (camp(problem(**{'"Мъ💥"': "1"})), "Мъ💥"),
    "problem_listed_twice": (camp(problem() + problem()), "listed twice"),
    "problem_too_many_elements": (camp(problem(M="65536", N="65536", K="65536")), "M=65536"),
    "problem_not_recorded": (camp(problem(M="7", N="7", K="7")), "M=7 N=7 K=7"),
    "problems_too_many": (camp("".join(problem(M=str(i)) for i in range(1, 1002))), "1001 problems"),
    # [space]
    "space_number": (camp(top="space = 5\n"), "[space]"),
    "space_unknown_param": (camp(space("FOO = [1]")), "FOO"),
    "space_sql_param": (camp(space('"x\'; DROP TABLE queue; --" = [1]')), "DROP TABLE queue"),
    "space_value_not_allowed": (camp(space("num_warps = [3]")), "space.num_warps: 3"),
    "space_value_not_recorded": (camp(space("num_warps = [2]")), "space.num_warps: 2"),
    "space_empty_list": (camp(space("num_warps = []")), "space.num_warps"),
    "space_scalar": (camp(space("num_warps = 4")), "space.num_warps"),
    "space_nested_table": (camp(space("num_warps = [{ a = 1 }]")), "space.num_warps"),
    "space_subtable": (camp("[space.num_warps]\na = 1\n"), "space.num_warps"),
    "space_bool": (camp(space("num_warps = [true]")), "space.num_warps: True"),
    "space_float": (camp(space("num_warps = [4.0]")), "space.num_warps: 4.0"),
    "space_text": (camp(space('num_warps = ["4"]')), "space.num_warps: '4'"),
    "space_unicode": (camp(space('num_warps = ["💥"]')), "💥"),
    "space_too_many_choices": (camp(space("num_warps = [" + ", ".join(["4"] * 1001) + "]")), "space.num_warps"),
    # [[configs]]
    "configs_number": (camp(top="configs = 5\n"), "'configs'"),
    "configs_array_of_numbers": (camp(top="configs = [1]\n"), "'configs'"),
    "config_missing_params": (camp("[[configs]]\nBLOCK_SIZE_M = 64\n"), "missing BLOCK_SIZE_N"),
    "config_unknown_param": (camp(config(FOO="1")), "FOO"),
    "config_bad_value": (camp(config(num_warps="3")), "num_warps=3"),
    "config_text_value": (camp(config(BLOCK_SIZE_M='"64"')), "BLOCK_SIZE_M='64'"),
    "config_float_value": (camp(config(BLOCK_SIZE_M="64.0")), "BLOCK_SIZE_M=64.0"),
    "config_bool_value": (camp(config(num_warps="true")), "num_warps=True"),
    "config_huge_value": (camp(config(BLOCK_SIZE_M="99999999999999999999")), "BLOCK_SIZE_M=99999999999999999999"),
    "config_html_key": (camp(config(**{'"<script>"': "1"})), "<script>"),
    "configs_too_many": (camp(config() * 1001), "1001 configs"),
}

# ---- building datasets -------------------------------------------------------------------------
DROP = object()
GOOD_PROBLEM = {"M": 512, "N": 512, "K": 512, "dtype": "fp16"}
GOOD_CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
               "num_warps": 4, "num_stages": 3}
RECORD = {"kernel": "matmul", "problem": GOOD_PROBLEM, "config": GOOD_CONFIG, "status": "ok", "median_ms": 0.1,
          "device": "synthetic device", "torch": "0.0", "triton": "0.0"}
GOOD_LINE = json.dumps(RECORD)


def rec(base: dict[str, Any] = RECORD, **changes: Any) -> str:
    merged = {**base, **changes}
    return json.dumps({k: v for k, v in merged.items() if v is not DROP}) + "\n"


def baseline(**changes: Any) -> str:
    return rec({"kernel": "matmul", "baseline": "cuBLAS", "problem": GOOD_PROBLEM, "median_ms": 0.1}, **changes)


DATASETS: dict[str, tuple[Content, str]] = {
    "dataset_empty": ("", "no records for kernel 'matmul'"),
    "dataset_blank_lines": ("\n\n  \n", "no records for kernel 'matmul'"),
    "dataset_garbled_json": (rec() + '{"kernel": "matmul", "problem": \n', ":2: not JSON"),
    "dataset_truncated_line": (rec()[:40] + "\n", ":1: not JSON"),
    "dataset_json_array_line": ("[1, 2, 3]\n", ":1: expected a JSON object"),
    "dataset_json_string_line": ('"hello"\n', ":1: expected a JSON object"),
    "dataset_only_other_kernel": (rec(kernel="conv2d"), "no records for kernel 'matmul'"),
    "dataset_binary": (bytes(range(256)) * 4, "not JSON"),
    "dataset_utf16": (rec().encode("utf-16"), "not JSON"),
    "dataset_csv_instead": ("kernel,problem,config\nmatmul,512,64\n", ":1: not JSON"),
    "dataset_missing_keys": (rec(status=DROP, device=DROP), "missing key(s) status, device"),
    "dataset_bad_status": (rec(status="fast"), "'fast'"),
    "dataset_html_status": (rec(status="<script>"), "'<script>'"),
    "dataset_ok_without_median": (rec(median_ms=None), "median_ms"),
    "dataset_failed_with_median": (rec(status="crashed"), "median_ms"),
    "dataset_negative_median": (rec(median_ms=-1), "median_ms=-1"),
    "dataset_zero_median": (rec(median_ms=0), "median_ms=0"),
    "dataset_nan_median": (rec(median_ms=float("nan")), "median_ms=nan"),
    "dataset_infinite_median": (rec(median_ms=float("inf")), "median_ms=inf"),
    "dataset_text_median": (rec(median_ms="0.1"), "median_ms='0.1'"),
    "dataset_bool_median": (rec(median_ms=True), "median_ms=True"),
    "dataset_negative_p20": (rec(p20_ms=-1), "p20_ms=-1"),
    "dataset_config_unknown_param": (rec(config={**GOOD_CONFIG, "FOO": 1}), "FOO"),
    "dataset_config_bad_value": (rec(config={**GOOD_CONFIG, "num_warps": 3}), "num_warps=3"),
    "dataset_config_not_object": (rec(config=5), "config"),
    "dataset_problem_bad_dims": (rec(problem={**GOOD_PROBLEM, "M": 0}), "M=0"),
    "dataset_problem_unknown_dtype": (rec(problem={**GOOD_PROBLEM, "dtype": "fp8"}), "'fp8'"),
    "dataset_problem_not_object": (rec(problem=5), "problem"),
    "dataset_reps_text": (rec(reps="abc"), "reps"),
    "dataset_reps_list": (rec(reps=[1]), "reps"),
    "dataset_reps_negative": (rec(reps=-5), "reps"),
    "dataset_baseline_without_median": (baseline(median_ms=DROP) + rec(), "baseline line needs median_ms"),
    "dataset_baseline_bad_problem": (baseline(problem=5) + rec(), "problem"),
    "dataset_baseline_reps_text": (baseline(reps="x") + rec(), "reps"),
}

# ---- command lines -----------------------------------------------------------------------------
# Placeholders: {camp} a good campaign, {ds} a good dataset, {db} a fresh path (must stay absent),
# {seeded} a db holding the finished campaign 'seeded' (must stay unchanged), {seeded_camp} its
# file, {other_ds} the dataset recorded on another device, {dir} a folder, {junk} a text file,
# {other} another program's SQLite db, {newer} a db of a newer schema, {empty} an empty file,
# {missing} an absent path, {nofolder} a path in an absent folder, {long} a too-long file name,
# {bf16} / {large} campaigns the interpreter refuses.
TUNE = ["tune", "{camp}", "--backend", "replay", "--dataset", "{ds}", "--db", "{db}"]


def tune_with(*extra: str, campaign: str = "{camp}", dataset: str = "{ds}", db: str = "{db}") -> list[str]:
    return ["tune", campaign, "--backend", "replay", "--dataset", dataset, "--db", db, *extra]


ARGS: dict[str, tuple[list[str], str]] = {
    "unknown_verb": (["frobnicate"], "'frobnicate'"),
    "unknown_verb_sql": (["'; DROP TABLE trials; --"], "DROP TABLE trials"),
    "tune_without_campaign": (["tune"], "campaign"),
    "tune_unknown_flag": ([*TUNE, "--frob"], "--frob"),
    "tune_flag_typo": ([*TUNE, "--budjet", "5"], "--budjet"),
    "tune_two_campaigns": (["tune", "{camp}", "{camp}", "--db", "{db}"], "good.toml"),
    "tune_budget_without_value": ([*TUNE, "--budget"], "--budget"),
    "history_unknown_flag": (["history", "--db", "{seeded}", "--frob"], "--frob"),
    "history_json_and_csv": (["history", "--db", "{seeded}", "--json", "--csv"], "--csv"),
    "best_json_and_csv": (["best", "--db", "{seeded}", "--json", "--csv"], "--csv"),
    "kernels_extra_flag": (["kernels", "--json"], "--json"),
    # campaign and dataset paths
    "campaign_is_a_directory": (tune_with(campaign="{dir}"), "adir"),
    "campaign_does_not_exist": (tune_with(campaign="{missing}"), "absent"),
    "campaign_name_too_long": (tune_with(campaign="{long}"), "xxxxxxxx"),
    "dataset_is_a_directory": (tune_with(dataset="{dir}"), "adir"),
    "dataset_does_not_exist": (tune_with(dataset="{missing}"), "absent"),
    "dataset_name_too_long": (tune_with(dataset="{long}"), "xxxxxxxx"),
    # backend, budget, proposer, workers
    "backend_unknown": (tune_with("--backend", "cuda"), "'cuda'"),
    "backend_empty": (tune_with("--backend", ""), "backend ''"),
    "backend_wrong_case": (tune_with("--backend", "REPLAY"), "'REPLAY'"),
    "backend_shell": (tune_with("--backend", "replay; rm -rf /"), "rm -rf /"),
    "dataset_with_gpu_backend": (tune_with("--backend", "gpu"), "--dataset"),
    "gpu_backend_without_problems": (["tune", "{camp}", "--backend", "gpu", "--db", "{db}"], "[[problems]]"),
    "interpret_refuses_bf16": (["tune", "{bf16}", "--backend", "interpret", "--db", "{db}"], "bf16"),
    "interpret_refuses_large_problem": (["tune", "{large}", "--backend", "interpret", "--db", "{db}"],
                                        "M=4096 N=4096 K=4096"),
    "budget_zero": (tune_with("--budget", "0"), "--budget 0"),
    "budget_negative": (tune_with("--budget", "-3"), "--budget -3"),
    "budget_text": (tune_with("--budget", "abc"), "'abc'"),
    "budget_float": (tune_with("--budget", "1.5"), "'1.5'"),
    "budget_empty": (tune_with("--budget", ""), "''"),
    "budget_above_limit": (tune_with("--budget", "100001"), "--budget 100001"),
    "budget_huge": (tune_with("--budget", "99999999999999999999"), "99999999999999999999"),
    "budget_exponent": (tune_with("--budget", "1e3"), "'1e3'"),
    "proposer_unknown": (tune_with("--proposer", "nope"), "'nope'"),
    "proposer_empty": (tune_with("--proposer", ""), "proposer ''"),
    "proposer_wrong_case": (tune_with("--proposer", "GRID"), "'GRID'"),
    "proposer_html": (tune_with("--proposer", "<script>alert(1)</script>"), "<script>alert(1)</script>"),
    "workers_zero": (tune_with("--workers", "0"), "--workers 0"),
    "workers_negative": (tune_with("--workers", "-1"), "--workers -1"),
    "workers_text": (tune_with("--workers", "x"), "'x'"),
    # the store
    "existing_campaign_without_resume": (tune_with(campaign="{seeded_camp}", db="{seeded}"), "'seeded'"),
    "resume_on_another_device": (tune_with("--resume", campaign="{seeded_camp}", dataset="{other_ds}",
                                           db="{seeded}"), "other device"),
    "tune_db_is_a_directory": (tune_with(db="{dir}"), "adir"),
    "tune_db_is_text": (tune_with(db="{junk}"), "junk.db"),
    "tune_db_of_another_program": (tune_with(db="{other}"), "other.db"),
    "tune_db_of_newer_schema": (tune_with(db="{newer}"), "newer.db"),
    "tune_db_in_missing_folder": (tune_with(db="{nofolder}"), "nofolder"),
    "tune_db_name_too_long": (tune_with(db="{long}"), "xxxxxxxx"),
    # history
    "history_problem_without_equals": (["history", "--db", "{seeded}", "--problem", "M"], "'M'"),
    "history_problem_empty_key": (["history", "--db", "{seeded}", "--problem", "=5"], "'=5'"),
    "history_problem_key_with_space": (["history", "--db", "{seeded}", "--problem", "M N=5"], "'M N'"),
    "history_problem_sql_key": (["history", "--db", "{seeded}", "--problem", "x') OR 1=1 --=5"], "OR 1"),
    "history_problem_huge_int": (["history", "--db", "{seeded}", "--problem", "M=99999999999999999999"],
                                 "99999999999999999999"),
    "history_status_unknown": (["history", "--db", "{seeded}", "--status", "nope"], "'nope'"),
    "history_status_sql": (["history", "--db", "{seeded}", "--status", "ok' OR '1'='1"], "OR '1'='1"),
    "history_campaign_unknown": (["history", "--db", "{seeded}", "--campaign", "nope"], "'nope'"),
    "history_campaign_html": (["history", "--db", "{seeded}", "--campaign", "<script>"], "'<script>'"),
    "history_limit_zero": (["history", "--db", "{seeded}", "--limit", "0"], "--limit 0"),
    "history_limit_negative": (["history", "--db", "{seeded}", "--limit", "-1"], "--limit -1"),
    "history_limit_text": (["history", "--db", "{seeded}", "--limit", "ten"], "'ten'"),
    "history_limit_huge": (["history", "--db", "{seeded}", "--limit", "99999999999999999999"],
                           "99999999999999999999"),
    "history_db_missing": (["history", "--db", "{missing}"], "absent"),
    "history_db_is_a_directory": (["history", "--db", "{dir}"], "adir"),
    "history_db_is_text": (["history", "--db", "{junk}"], "junk.db"),
    "history_db_of_another_program": (["history", "--db", "{other}"], "other.db"),
    "history_db_empty_file": (["history", "--db", "{empty}"], "empty.db"),
    "history_db_of_newer_schema": (["history", "--db", "{newer}"], "newer.db"),
    # best
    "best_campaign_unknown": (["best", "--db", "{seeded}", "--campaign", "nope"], "'nope'"),
    "best_db_missing": (["best", "--db", "{missing}"], "absent"),
    "best_db_is_a_directory": (["best", "--db", "{dir}"], "adir"),
    "best_db_is_text": (["best", "--db", "{junk}"], "junk.db"),
    "best_db_empty_file": (["best", "--db", "{empty}"], "empty.db"),
    # dashboard (the server must not start: see `no_server`)
    "dashboard_port_zero": (["dashboard", "--db", "{seeded}", "--port", "0"], "--port 0"),
    "dashboard_port_too_big": (["dashboard", "--db", "{seeded}", "--port", "70000"], "--port 70000"),
    "dashboard_port_negative": (["dashboard", "--db", "{seeded}", "--port", "-1"], "--port -1"),
    "dashboard_port_text": (["dashboard", "--db", "{seeded}", "--port", "http"], "'http'"),
    "dashboard_db_missing": (["dashboard", "--db", "{missing}"], "absent"),
    "dashboard_db_is_a_directory": (["dashboard", "--db", "{dir}"], "adir"),
    "dashboard_db_is_text": (["dashboard", "--db", "{junk}"], "junk.db"),
    "dashboard_db_of_another_program": (["dashboard", "--db", "{other}"], "other.db"),
    "dashboard_host_empty": (["dashboard", "--db", "{seeded}", "--host", ""], "host"),
}

# A few cases again through `python -m tilepilot`, to see what really reaches the terminal.
VIA_SUBPROCESS = ["binary_junk", "toml_unclosed_table", "name_sql", "dataset_garbled_json", "budget_text",
                  "unknown_verb", "tune_db_is_text", "tune_db_is_a_directory", "history_problem_without_equals",
                  "dataset_reps_text"]


# ---- the workspace -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seeded_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A db holding the finished campaign 'seeded', made once and copied into each workspace."""
    root = tmp_path_factory.mktemp("seeded")
    dataset = write_dataset(root / "d.jsonl")
    campaign = write_campaign(root / "seeded.toml", name="seeded", budget=3)
    db = root / "seeded.db"
    assert main(["tune", str(campaign), "--backend", "replay", "--dataset", str(dataset), "--db", str(db)]) == 0
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    return db, campaign


@pytest.fixture()
def ws(tmp_path: Path, seeded_template: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    import tilepilot.dashboard.launch as launch

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("the dashboard server was started")

    monkeypatch.setattr(launch, "subprocess", SimpleNamespace(Popen=refuse))
    monkeypatch.chdir(tmp_path)
    seeded_db, seeded_camp = seeded_template
    ds = write_dataset(tmp_path / "d.jsonl")
    (tmp_path / "other_device.jsonl").write_text(ds.read_text().replace("synthetic device", "other device"))
    (tmp_path / "adir").mkdir()
    (tmp_path / "junk.db").write_text("this is a text file, not a database\n" * 50)
    (tmp_path / "empty.db").write_bytes(b"")
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    con.execute("INSERT INTO notes (body) VALUES ('keep me')")
    con.commit()
    con.close()
    shutil.copy(seeded_db, tmp_path / "newer.db")
    con = sqlite3.connect(tmp_path / "newer.db")
    con.execute("PRAGMA user_version = 99")
    con.close()
    shutil.copy(seeded_db, tmp_path / "seeded.db")
    bf16 = camp(problem(dtype='"bf16"', M="64", N="64", K="64"), name='"bf16"')
    large = camp(problem(M="4096", N="4096", K="4096"), name='"large"')
    (tmp_path / "bf16.toml").write_text(bf16)
    (tmp_path / "large.toml").write_text(large)
    return {
        "camp": str(write_campaign(tmp_path / "good.toml", name="good", budget=4)),
        "ds": str(ds), "db": str(tmp_path / "fresh.db"), "seeded": str(tmp_path / "seeded.db"),
        "seeded_camp": str(seeded_camp), "other_ds": str(tmp_path / "other_device.jsonl"),
        "dir": str(tmp_path / "adir"), "junk": str(tmp_path / "junk.db"), "other": str(tmp_path / "other.db"),
        "newer": str(tmp_path / "newer.db"), "empty": str(tmp_path / "empty.db"),
        "missing": str(tmp_path / "absent.toml"), "nofolder": str(tmp_path / "nofolder" / "x.db"),
        "long": str(tmp_path / ("x" * 300)), "bf16": str(tmp_path / "bf16.toml"),
        "large": str(tmp_path / "large.toml"), "root": str(tmp_path),
    }


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its checksum; a db's -wal counts (empty as absent), -shm not."""
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name.endswith("-shm"):
            continue
        data = p.read_bytes()
        if p.name.endswith("-wal") and not data:
            continue
        out[str(p.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return out


# ---- running and checking ----------------------------------------------------------------------
def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def run_as_program(argv: list[str], cwd: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "tilepilot", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout, proc.stderr


def check_rejected(run: Callable[[], tuple[int, str, str]], root: Path, names: str) -> None:
    before = snapshot(root)
    code, out, err = run()
    assert "Traceback" not in err, err
    assert err.startswith("tilepilot: error:"), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert names in err, f"the error does not name {names!r}: {err}"
    assert code == 2, err
    assert out == ""
    assert snapshot(root) == before, "the command wrote something"


def fill(argv: list[str], ws: dict[str, str]) -> list[str]:
    return [a.format(**ws) for a in argv]


def write(path: Path, content: Content) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# ---- the tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CAMPAIGNS))
def test_bad_campaign_file_is_rejected(case: str, ws: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    content, names = CAMPAIGNS[case]
    path = str(write(Path(ws["root"]) / "bad.toml", content))
    for db in (ws["db"], ws["seeded"]):
        argv = fill(tune_with(campaign=path, db=db), ws)
        check_rejected(lambda argv=argv: run_in_process(argv, capsys), Path(ws["root"]), names)


@pytest.mark.parametrize("case", list(DATASETS))
def test_bad_dataset_is_rejected(case: str, ws: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    content, names = DATASETS[case]
    path = str(write(Path(ws["root"]) / "bad.jsonl", content))
    for db in (ws["db"], ws["seeded"]):
        argv = fill(tune_with(dataset=path, db=db), ws)
        check_rejected(lambda argv=argv: run_in_process(argv, capsys), Path(ws["root"]), names)


@pytest.mark.parametrize("case", list(ARGS))
def test_bad_command_line_is_rejected(case: str, ws: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    argv, names = ARGS[case]
    check_rejected(lambda: run_in_process(fill(argv, ws), capsys), Path(ws["root"]), names)


def _argv_for(case: str, ws: dict[str, str]) -> tuple[list[str], str]:
    root = Path(ws["root"])
    if case in CAMPAIGNS:
        content, names = CAMPAIGNS[case]
        return fill(tune_with(campaign=str(write(root / "bad.toml", content))), ws), names
    if case in DATASETS:
        content, names = DATASETS[case]
        return fill(tune_with(dataset=str(write(root / "bad.jsonl", content))), ws), names
    argv, names = ARGS[case]
    return fill(argv, ws), names


@pytest.mark.parametrize("case", VIA_SUBPROCESS)
def test_bad_input_reaches_the_terminal_as_one_line(case: str, ws: dict[str, str]) -> None:
    argv, names = _argv_for(case, ws)
    check_rejected(lambda: run_as_program(argv, ws["root"]), Path(ws["root"]), names)

