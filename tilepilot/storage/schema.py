"""The SQLite schema, its version, and how a file is opened and migrated.

Conventions, for every table:
- times are epoch seconds (REAL, UTC), in columns named `*_at` or `ts`;
- dicts (problems, configs, extra data) are JSON text; `problem_key` / `config_key` are the
  canonical JSON of `Problem.key()` / `Config.key()`, which is what filters and joins use;
- booleans are INTEGER 0/1; a missing number is NULL.

The schema version lives in `PRAGMA user_version`. `MIGRATIONS[i]` takes a database from
version i to i + 1; to add a column later, append a step (e.g. `ALTER TABLE ... ADD COLUMN`)
and never edit an old one.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

import sqlite_utils

from tilepilot.experiments import InputError

log = logging.getLogger(__name__)

TABLES = ("campaigns", "experiments", "results", "trials", "queue", "events", "gpu_samples", "winners",
          "hypotheses", "verdicts", "evidence", "learnings", "llm_calls", "devices")
CAMPAIGN_STATES = ("running", "finished", "interrupted", "failed")
QUEUE_STATES = ("queued", "compiling", "running", "done", "dropped")

_V1 = """
CREATE TABLE campaigns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    kernel TEXT NOT NULL,
    proposer TEXT NOT NULL,
    budget INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    backend TEXT NOT NULL,
    dataset TEXT NOT NULL DEFAULT '',
    device TEXT NOT NULL,
    state TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    problems TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX campaigns_state ON campaigns(state);
CREATE INDEX campaigns_kernel ON campaigns(kernel);

CREATE TABLE experiments (
    key TEXT PRIMARY KEY,
    kernel TEXT NOT NULL,
    kernel_version TEXT NOT NULL,
    problem TEXT NOT NULL,
    problem_key TEXT NOT NULL,
    config TEXT NOT NULL,
    config_key TEXT NOT NULL,
    backend TEXT NOT NULL,
    device TEXT NOT NULL,
    torch TEXT NOT NULL,
    triton TEXT NOT NULL,
    driver TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE INDEX experiments_kernel_problem ON experiments(kernel, problem_key);
CREATE INDEX experiments_device ON experiments(device);

CREATE TABLE results (
    experiment_key TEXT PRIMARY KEY REFERENCES experiments(key),
    status TEXT NOT NULL,
    median_ms REAL,
    p20_ms REAL,
    p80_ms REAL,
    min_ms REAL,
    reps INTEGER,
    rel_spread REAL,
    l2_flushed INTEGER,
    timing_method TEXT,
    max_rel_err REAL,
    compile_ms REAL,
    message TEXT NOT NULL DEFAULT '',
    sm_clock_mhz REAL,
    power_w REAL,
    temp_c REAL,
    extra TEXT NOT NULL DEFAULT '{}',
    worker TEXT NOT NULL DEFAULT '',
    measured_at REAL NOT NULL
);
CREATE INDEX results_status ON results(status);

CREATE TABLE trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    problem_key TEXT NOT NULL,
    experiment_key TEXT NOT NULL REFERENCES experiments(key),
    seq INTEGER NOT NULL,
    proposer TEXT NOT NULL,
    rationale TEXT NOT NULL DEFAULT '',
    predicted_ms REAL,
    hypothesis_id TEXT,
    reused INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    UNIQUE (campaign_id, experiment_key),
    UNIQUE (campaign_id, problem_key, seq)
);
CREATE INDEX trials_experiment ON trials(experiment_key);
CREATE INDEX trials_proposer ON trials(proposer);

CREATE TABLE queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    problem_key TEXT NOT NULL,
    problem TEXT NOT NULL,
    config TEXT NOT NULL,
    config_key TEXT NOT NULL,
    proposer TEXT NOT NULL,
    rationale TEXT NOT NULL DEFAULT '',
    predicted_ms REAL,
    hypothesis_id TEXT,
    priority REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL,
    worker TEXT NOT NULL DEFAULT '',
    experiment_key TEXT NOT NULL DEFAULT '',
    enqueued_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    UNIQUE (campaign_id, problem_key, config_key)
);
CREATE INDEX queue_campaign_state ON queue(campaign_id, state, priority DESC, id);
CREATE INDEX queue_state ON queue(state);

CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    campaign_id INTEGER REFERENCES campaigns(id),
    kind TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_campaign ON events(campaign_id, id);
CREATE INDEX events_kind ON events(kind, id);

CREATE TABLE gpu_samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    node TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    name TEXT NOT NULL,
    util_pct REAL,
    mem_used_mb REAL,
    mem_total_mb REAL,
    sm_clock_mhz REAL,
    power_w REAL,
    temp_c REAL,
    throttle TEXT NOT NULL DEFAULT '',
    worker TEXT NOT NULL DEFAULT '',
    running TEXT NOT NULL DEFAULT ''
);
CREATE INDEX gpu_samples_ts ON gpu_samples(ts);
CREATE INDEX gpu_samples_uuid_ts ON gpu_samples(gpu_uuid, ts);

CREATE TABLE winners (
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    problem_key TEXT NOT NULL,
    experiment_key TEXT NOT NULL REFERENCES experiments(key),
    median_ms REAL NOT NULL,
    rel_spread REAL,
    runner_up_key TEXT,
    runner_up_ms REAL,
    margin REAL,
    tie INTEGER NOT NULL DEFAULT 0,
    recheck_passed INTEGER,
    recheck_err REAL,
    median_config_ms REAL,
    baseline_ms REAL,
    baseline_name TEXT NOT NULL DEFAULT '',
    decided_at REAL NOT NULL,
    PRIMARY KEY (campaign_id, problem_key)
);
"""


# The hypothesis ledger. A hypothesis row holds the statement and its latest verdict; `verdicts`
# keeps every change of state; `evidence` the pairs of experiments (configs that differ only in
# the hypothesis' parameter) with median_ms(b) / median_ms(a); `learnings` the validated ones
# with their scope and toolchain. Values a and b and the scope are JSON (a scope is a list of
# [param, op, value]); `statement_key` is the same for the same claim in any campaign.
_V2 = """
CREATE TABLE hypotheses (
    id TEXT PRIMARY KEY,
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    statement_key TEXT NOT NULL,
    kernel TEXT NOT NULL,
    device TEXT NOT NULL,
    param TEXT NOT NULL,
    value_a TEXT NOT NULL,
    value_b TEXT NOT NULL,
    scope TEXT NOT NULL,
    text TEXT NOT NULL,
    rationale TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL,
    state TEXT NOT NULL,
    pairs INTEGER NOT NULL DEFAULT 0,
    wins INTEGER NOT NULL DEFAULT 0,
    losses INTEGER NOT NULL DEFAULT 0,
    effect REAL,
    ci_low REAL,
    ci_high REAL,
    noise REAL,
    reason TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    decided_at REAL
);
CREATE INDEX hypotheses_kernel_device ON hypotheses(kernel, device);
CREATE INDEX hypotheses_campaign ON hypotheses(campaign_id);
CREATE INDEX hypotheses_statement ON hypotheses(statement_key);

CREATE TABLE verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hypothesis_id TEXT NOT NULL REFERENCES hypotheses(id),
    state TEXT NOT NULL,
    pairs INTEGER NOT NULL,
    wins INTEGER NOT NULL,
    losses INTEGER NOT NULL,
    effect REAL,
    ci_low REAL,
    ci_high REAL,
    noise REAL NOT NULL,
    reason TEXT NOT NULL,
    decided_at REAL NOT NULL
);
CREATE INDEX verdicts_hypothesis ON verdicts(hypothesis_id, id);

CREATE TABLE evidence (
    hypothesis_id TEXT NOT NULL REFERENCES hypotheses(id),
    experiment_a TEXT NOT NULL REFERENCES experiments(key),
    experiment_b TEXT NOT NULL REFERENCES experiments(key),
    problem_key TEXT NOT NULL,
    ratio REAL NOT NULL,
    relation TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (hypothesis_id, experiment_a, experiment_b)
);
CREATE INDEX evidence_experiment_a ON evidence(experiment_a);
CREATE INDEX evidence_experiment_b ON evidence(experiment_b);

CREATE TABLE learnings (
    id TEXT PRIMARY KEY,
    hypothesis_id TEXT NOT NULL UNIQUE REFERENCES hypotheses(id),
    kernel TEXT NOT NULL,
    device TEXT NOT NULL,
    torch TEXT NOT NULL,
    triton TEXT NOT NULL,
    scope TEXT NOT NULL,
    text TEXT NOT NULL,
    effect REAL NOT NULL,
    pairs INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX learnings_kernel_device ON learnings(kernel, device);

CREATE INDEX experiments_config ON experiments(config_key);
CREATE INDEX trials_hypothesis ON trials(hypothesis_id);
"""


# One row per request the `llm` proposer made: the model, the token counts and the cost from the
# response's usage (cost NULL for a model without a known price, or a failed call), why it stopped,
# the API's request id, the error ('' if none), and what came of the reply: proposals accepted and
# rejected, the reasons (JSON list of one-line texts), the model's learnings (JSON list, unverified
# text). Never the API key, the prompt or the raw reply.
_V3 = """
CREATE TABLE llm_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
    problem_key TEXT NOT NULL,
    model TEXT NOT NULL,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cache_read_tokens INTEGER,
    cache_creation_tokens INTEGER,
    cost_usd REAL,
    stop_reason TEXT,
    request_id TEXT,
    error TEXT NOT NULL DEFAULT '',
    duration_ms REAL,
    proposals_accepted INTEGER NOT NULL DEFAULT 0,
    proposals_rejected INTEGER NOT NULL DEFAULT 0,
    hypotheses_stated INTEGER NOT NULL DEFAULT 0,
    rejected_reasons TEXT NOT NULL DEFAULT '[]',
    learnings TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX llm_calls_campaign ON llm_calls(campaign_id, id);
"""


# Version 4: what a measurement needs to be trusted and read, what a person asks of a running
# campaign, and where an experiment came from.
# - `devices`: each device's ceilings, measured once per (device, driver): device-to-device copy
#   bandwidth and the vendor bf16 matmul rate (cuBLAS on random data); roofline percentages use them.
#   `details` is JSON (sizes, repetitions, spread).
# - results: the spread target and time cap the adaptive repetitions ran under, and why they
#   stopped ("spread" | "cap" | "" where not adaptive); `timed_ms` the GPU time spent timing.
# - campaigns: `control` a person's request the driver honours at its next step ("" | "pause" |
#   "stop"); `gpu_seconds` and `llm_cost_usd` spent; `estimate` the dry-run estimate and, at the
#   end, the actual beside it (JSON).
# - queue: `pinned` keeps an entry at the head of its campaign's queue, whatever the re-scoring says.
# - indexes for the recently-done queue and a campaign's trials in order (the dashboard and CLI
#   at 100k experiments).
# - experiments: `origin` is "" for an experiment measured by tilepilot, else where it came from
#   ("vllm:<file>", "triton-cache:<dir>"): imported, not measured here; `origin_data` (JSON) what the
#   source said about it (vLLM: the file's key M; Triton's cache: its tuning key, its own timings in ms
#   and whether it was the cache's pick). An imported experiment has no `results` row: nothing was
#   measured here.
_V4 = """
CREATE TABLE devices (
    device TEXT NOT NULL,
    driver TEXT NOT NULL DEFAULT '',
    copy_gbps REAL,
    matmul_tflops REAL,
    matmul_dtype TEXT NOT NULL DEFAULT 'bf16',
    details TEXT NOT NULL DEFAULT '{}',
    measured_at REAL NOT NULL,
    PRIMARY KEY (device, driver)
);
ALTER TABLE results ADD COLUMN spread_target REAL;
ALTER TABLE results ADD COLUMN time_cap_ms REAL;
ALTER TABLE results ADD COLUMN stop_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN timed_ms REAL;
ALTER TABLE campaigns ADD COLUMN control TEXT NOT NULL DEFAULT '';
ALTER TABLE campaigns ADD COLUMN gpu_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE campaigns ADD COLUMN llm_cost_usd REAL NOT NULL DEFAULT 0;
ALTER TABLE campaigns ADD COLUMN estimate TEXT NOT NULL DEFAULT '{}';
ALTER TABLE queue ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE experiments ADD COLUMN origin TEXT NOT NULL DEFAULT '';
CREATE INDEX queue_state_finished ON queue(state, finished_at);
CREATE INDEX trials_campaign_id ON trials(campaign_id, id);
ALTER TABLE experiments ADD COLUMN origin_data TEXT NOT NULL DEFAULT '{}';
"""


def _v0_to_v1(db: sqlite_utils.Database) -> None:
    db.executescript(_V1)


def _v1_to_v2(db: sqlite_utils.Database) -> None:
    db.executescript(_V2)


def _v2_to_v3(db: sqlite_utils.Database) -> None:
    db.executescript(_V3)


def _v3_to_v4(db: sqlite_utils.Database) -> None:
    db.executescript(_V4)


# MIGRATIONS[i] takes the schema from version i to i + 1.
MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (_v0_to_v1, _v1_to_v2, _v2_to_v3,
                                                                  _v3_to_v4)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(db: sqlite_utils.Database) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def connect(path: Path, *, readonly: bool) -> sqlite_utils.Database:
    """A sqlite-utils Database on our own connection: 30 s busy timeout, any thread, FKs on.

    A read-only connection opens `path` through a `mode=ro` URI: it can neither write nor
    create the file.
    """
    if readonly:
        target, uri = path.resolve().as_uri() + "?mode=ro", True
    else:
        target, uri = str(path), False
    conn = sqlite3.connect(target, timeout=30, check_same_thread=False, uri=uri)
    db = sqlite_utils.Database(conn, execute_plugins=False)
    db.execute("PRAGMA foreign_keys=ON")
    return db


def migrate(db: sqlite_utils.Database, origin: str) -> int:
    """Bring the schema to SCHEMA_VERSION in one write transaction; returns the version found.

    The version is read again under the write lock, so two processes opening a new file at
    once migrate it once. Raises InputError when the file was written by a newer tilepilot
    or is another program's database.
    """
    found = _usable_version(db, origin)
    if found == SCHEMA_VERSION:
        return found
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = _usable_version(db, origin)
        for version in range(current, SCHEMA_VERSION):
            MIGRATIONS[version](db)
            db.execute(f"PRAGMA user_version={version + 1:d}")  # a pragma cannot take a parameter
            log.info("migrated %s to schema version %d", origin, version + 1)
        conn.execute("COMMIT")
    except BaseException:
        db.rollback()
        raise
    return found


def _usable_version(db: sqlite_utils.Database, origin: str) -> int:
    found = schema_version(db)
    if found > SCHEMA_VERSION:
        raise InputError(f"database {origin!r} has schema version {found}, newer than this tilepilot "
                         f"knows ({SCHEMA_VERSION}): upgrade tilepilot")
    if found == 0 and db.table_names():
        raise InputError(f"{origin!r} is not a tilepilot database (it has tables but no tilepilot schema)")
    return found


def check_readable(db: sqlite_utils.Database, origin: str) -> None:
    """Raises InputError unless the file holds exactly the schema this code reads."""
    found = schema_version(db)
    if found == SCHEMA_VERSION:
        return
    if found == 0:
        raise InputError(f"{origin!r} is not a tilepilot database")
    if found > SCHEMA_VERSION:
        raise InputError(f"database {origin!r} has schema version {found}, newer than this tilepilot "
                         f"knows ({SCHEMA_VERSION}): upgrade tilepilot")
    raise InputError(f"database {origin!r} has schema version {found}, older than {SCHEMA_VERSION}: "
                     "run `tilepilot tune --resume` on it once to migrate it")


def open_database(path: Path, *, readonly: bool) -> sqlite_utils.Database:
    """Open (a writer also creates, sets WAL on and migrates) a tilepilot database.

    Raises InputError for a missing file (readers), a missing folder (writers), a file that is
    not a tilepilot database, or a schema this code cannot use.
    """
    origin = str(path)
    try:
        path.stat()
    except FileNotFoundError:
        pass
    except OSError as e:  # a name too long, a component that is not a folder, ...
        raise InputError(f"cannot open database {origin!r}: {e.strerror}") from None
    if readonly and not path.is_file():
        raise InputError(f"no tilepilot database at {origin!r} (run `tilepilot tune` first or pass --db)")
    if not readonly and not path.parent.is_dir():
        raise InputError(f"cannot create database {origin!r}: folder {str(path.parent)!r} does not exist")
    if path.exists() and not path.is_file():
        raise InputError(f"database {origin!r} is not a file")
    try:
        db = connect(path, readonly=readonly)
    except sqlite3.OperationalError as e:  # a name the file system refuses, no permission
        raise InputError(f"cannot open database {origin!r}: {e}") from None
    try:
        if readonly:
            check_readable(db, origin)
        else:
            _usable_version(db, origin)  # refuse another program's file before touching it
            db.enable_wal()
            # In WAL mode NORMAL is safe against a killed process (kill -9 loses nothing that was
            # committed); only a power loss can drop the last commits. FULL waited for the disk on
            # every commit: 8.5 ms a trial on a busy disk, against 2.4 ms (bench/throughput.py).
            db.execute("PRAGMA synchronous=NORMAL")
            migrate(db, origin)
    except sqlite3.DatabaseError as e:
        db.close()
        if isinstance(e, sqlite3.OperationalError) and path.is_file() and "unable to open" not in str(e):
            raise  # locked, I/O: not the user's input
        raise InputError(f"{origin!r} is not a tilepilot database ({e})") from None
    except BaseException:
        db.close()
        raise
    return db
