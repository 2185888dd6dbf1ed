"""The matmul family on the CPU side: problems, space, constraints, work, specialisation; the
variant parameters (VARIANT, SPLIT_K, ALIGN_HINT): their defaults for configs recorded before
them, their conditional constraints and the alignment the hint asserts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilepilot.experiments import Config, InputError, Problem
from tilepilot.kernels.faults import FAULTS
from tilepilot.kernels.matmul import MatmulFamily, accumulator_fits_registers, alignment, pipelined_shared_bytes
from tilepilot.kernels.registry import get_family

FAMILY = MatmulFamily()


def problem(m: int = 64, n: int = 64, k: int = 64, dtype: str = "bf16") -> Problem:
    return FAMILY.parse_problem({"M": m, "N": n, "K": k, "dtype": dtype})


def config(bm: int = 128, bn: int = 128, bk: int = 64, g: int = 8, w: int = 4, s: int = 3) -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
                      "num_warps": w, "num_stages": s})


def test_parse_problem_keeps_keys_in_order() -> None:
    p = FAMILY.parse_problem({"dtype": "fp16", "K": 65, "N": 47, "M": 33})
    assert list(p) == ["M", "N", "K", "dtype"] and p.label() == "M=33 N=47 K=65 fp16"


@pytest.mark.parametrize(("raw", "pattern"), [
    ({"M": 1, "N": 1, "K": 1, "dtype": "fp32"}, r"dtype='fp32' is not one of \{bf16, fp16\}"),
    ({"M": 0, "N": 1, "K": 1, "dtype": "bf16"}, r"M=0 is not a positive integer up to 65536"),
    ({"M": 1, "N": 65537, "K": 1, "dtype": "bf16"}, r"N=65537 is not a positive integer up to 65536"),
    ({"M": 1, "N": 1, "K": True, "dtype": "bf16"}, r"K=True is not a positive integer"),
    ({"M": 1.5, "N": 1, "K": 1, "dtype": "bf16"}, r"M=1.5 is not a positive integer"),
    ({"N": 1, "K": 1, "dtype": "bf16"}, r"missing M"),
    ({"M": 1, "N": 1, "K": 1, "dtype": "bf16", "batch": 2},
     r"unknown matmul problem key 'batch' \(allowed: M, N, K, dtype\)"),
    ({"M": 65536, "N": 65536, "K": 16, "dtype": "bf16"}, r"C \(M×N\) has 4294967296 elements"),
])
def test_parse_problem_rejects_with_one_line_naming_key_and_allowed(raw: dict, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern) as err:
        FAMILY.parse_problem(raw)
    assert "\n" not in str(err.value)


def test_space_has_the_tutorial_parameters_and_the_variant_ones() -> None:
    space = FAMILY.space()
    assert space.names == ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                           "num_stages", "VARIANT", "SPLIT_K", "ALIGN_HINT", "EPILOGUE_SUBTILE", "WARP_SPECIALIZE",
                           "PAD_ROWS")
    assert space.param("VARIANT").choices == ("grouped", "splitk", "persistent", "tma", "splitk_fused", "tma_tail",
                                              "streamk", "tma_splitk")
    assert space.param("BLOCK_SIZE_N").choices == (16, 32, 64, 128, 160, 192, 256)
    assert space.param("PAD_ROWS").choices == ("none", "A", "B", "AB")
    assert space.size == 5 * 7 * 5 * 4 * 3 * 4 * 8 * 5 * 2 * 2 * 2 * 4


def test_shared_memory_constraint_names_the_need_and_the_limit() -> None:
    big = config(256, 256, 128, s=3)
    reason = FAMILY.space().check(big, problem())
    assert reason is not None and "393216 B" in reason and "232448 B" in reason
    assert FAMILY.space().check(config(128, 256, 64, w=8, s=3), problem()) is None
    assert pipelined_shared_bytes(config(128, 256, 64, s=3), problem()) == 147456


def test_an_accumulator_larger_than_a_threads_registers_is_refused_with_its_count() -> None:
    reason = FAMILY.space().check(config(128, 256, 64, w=4), problem())
    assert reason == ("the 128×256 fp32 accumulator takes 256 registers per thread with num_warps=4, more than "
                      "the 255 a thread can have: it always spills")
    assert FAMILY.space().check(config(128, 128, 32, w=4), problem()) is None  # 128 per thread
    assert FAMILY.space().check(config(128, 256, 32, w=8), problem()) is None


def test_every_recorded_config_the_register_constraint_refuses_spilled_and_lost() -> None:
    """The constraint came after the H100 and H200 grids were recorded: those configs are in them,
    measured, and each one spilled and ran at least 1.9x slower than its problem's best."""
    import gzip
    import json

    from tilepilot.orchestrator.replay import DATA_DIR

    refused = 0
    for name in ("matmul-h100.jsonl.gz", "matmul-h200.jsonl.gz", "matmul-variants-h100.jsonl.gz"):
        path = DATA_DIR / name
        with (gzip.open(path, "rt") if name.endswith(".gz") else path.open()) as f:
            rows = [r for r in map(json.loads, f) if "config" in r]
        best: dict[str, float] = {}
        for r in rows:
            if r["status"] == "ok":
                key = json.dumps(r["problem"], sort_keys=True)
                best[key] = min(best.get(key, r["median_ms"]), r["median_ms"])
        for r in rows:
            p, c = Problem.of(r["problem"]), FAMILY.space().parse(r["config"])
            if accumulator_fits_registers(c, p) is None or r["status"] != "ok":
                continue
            refused += 1
            assert r["n_spills"] >= 128, (name, p.label(), c.label())
            assert r["median_ms"] >= 1.9 * best[json.dumps(r["problem"], sort_keys=True)], (name, p.label(), c.label())
    assert refused == 672


def test_default_config_is_valid_for_any_problem() -> None:
    for p in (problem(1, 4096, 4096), problem(3000, 5000, 1000, "fp16"), problem()):
        cfg = FAMILY.default_config(p)
        assert FAMILY.space().check(cfg, p) is None
        assert FAMILY.space().parse(cfg.as_dict()) == cfg


def test_work_counts_flops_and_each_operand_once() -> None:
    w = FAMILY.work(problem(4096, 2048, 1024))
    assert w.flops == 2 * 4096 * 2048 * 1024
    assert w.bytes == 2 * (4096 * 1024 + 1024 * 2048 + 4096 * 2048)
    assert w.tflops(1.0) == pytest.approx(w.flops / 1e-3 / 1e12)


def test_specialisation_is_shared_by_aligned_problems_only() -> None:
    cfg = config()
    spec = FAMILY.specialisation
    assert spec(problem(4096, 4096, 4096), cfg) == spec(problem(2048, 8192, 1024), cfg)
    assert spec(problem(4096, 4096, 4096), cfg) != spec(problem(4096, 4096, 4096, "fp16"), cfg)
    assert spec(problem(1, 4096, 4096), cfg) != spec(problem(16, 4096, 4096), cfg)
    assert spec(problem(3000, 5000, 1000), cfg) != spec(problem(3008, 5008, 1008), cfg)


def test_kernel_version_hashes_the_kernel_source() -> None:
    version = FAMILY.kernel_version()
    assert version.startswith("1+") and len(version) == 2 + 12
    assert get_family("matmul_faults").kernel_version() != version


def test_faults_family_extends_the_space_with_fault() -> None:
    faults = get_family("matmul_faults")
    assert faults.space().names[-1] == "FAULT" and faults.space().param("FAULT").choices == FAULTS
    assert "VARIANT" not in faults.space().names  # the faults family keeps the grouped kernel
    cfg = faults.default_config(problem())
    assert cfg["FAULT"] == "none" and faults.space().check(cfg, problem()) is None
    assert "FAULT:oob" in faults.specialisation(problem(), Config.of({**cfg.as_dict(), "FAULT": "oob"}))


# ---- variants ---------------------------------------------------------------------------------------
def variant(v: str = "grouped", split: int = 1, hint: bool = False, EPILOGUE_SUBTILE: bool = False,
            WARP_SPECIALIZE: bool = False, PAD_ROWS: str = "none", **tile: int) -> Config:
    return Config.of({**config(**tile).as_dict(), "VARIANT": v, "SPLIT_K": split, "ALIGN_HINT": hint,
                      "EPILOGUE_SUBTILE": EPILOGUE_SUBTILE, "WARP_SPECIALIZE": WARP_SPECIALIZE, "PAD_ROWS": PAD_ROWS})


def test_config_recorded_before_the_variants_parses_as_the_grouped_kernel() -> None:
    old = config().as_dict()
    parsed = FAMILY.space().parse(old)
    assert parsed == variant() and list(parsed)[-6:] == ["VARIANT", "SPLIT_K", "ALIGN_HINT", "EPILOGUE_SUBTILE",
                                                         "WARP_SPECIALIZE", "PAD_ROWS"]
    assert FAMILY.space().parse(variant("splitk", 4).as_dict())["SPLIT_K"] == 4
    with pytest.raises(InputError, match=r"VARIANT='cutlass' is not one of \{grouped, splitk, persistent, tma, "
                                         r"splitk_fused, tma_tail, streamk, tma_splitk\}"):
        FAMILY.space().parse({**old, "VARIANT": "cutlass"})
    with pytest.raises(InputError, match="missing BLOCK_SIZE_M"):  # a parameter without a default stays required
        FAMILY.space().parse({k: v for k, v in old.items() if k != "BLOCK_SIZE_M"})


def test_defaults_survive_narrowing_and_restriction() -> None:
    space = FAMILY.space()
    narrowed = space.narrowed({"VARIANT": ["grouped", "splitk"], "num_warps": [4]})
    assert narrowed.param("VARIANT").default == "grouped" and narrowed.param("SPLIT_K").default == 1
    assert narrowed.parse(config().as_dict()) == variant()
    restricted = space.restricted([variant(), variant("splitk", 2)])
    assert restricted.param("VARIANT").choices == ("grouped", "splitk")
    assert restricted.param("ALIGN_HINT").default is False
    assert restricted.parse(config().as_dict()) == variant()


def test_a_config_without_variant_parameters_is_checked_as_the_grouped_kernel() -> None:
    space = FAMILY.space()
    assert space.check(config(), problem(3000, 5000, 1000, "fp16")) is None
    assert space.check(config(256, 256, 128), problem()) == space.check(variant(bm=256, bn=256, bk=128), problem())


@pytest.mark.parametrize(("cfg", "prob", "reason"), [
    (variant("splitk", 1), problem(), "VARIANT=splitk needs SPLIT_K of 2 or more"),
    (variant("grouped", 4), problem(), "SPLIT_K=4 is only for VARIANT=splitk"),
    (variant("persistent", 2), problem(), "SPLIT_K=2 is only for VARIANT=splitk"),
    (variant("tma", hint=True), problem(3000, 5000, 1000, "fp16"),
     "ALIGN_HINT=True is for pointer loads; VARIANT=tma loads through tensor descriptors"),
    (variant(hint=True), problem(4096, 4096, 4096),
     "ALIGN_HINT=True has nothing to assert: K=4096 and N=4096 are each a multiple of 16"),
    (variant(hint=True), problem(64, 47, 65), "K=65 and N=47"),
    (variant("splitk", 8, bk=128), problem(16384, 16384, 256),
     "SPLIT_K=8 leaves a split without work: K=256 is 2 block(s) of BLOCK_SIZE_K=128"),
    (variant("splitk", 8, bk=64), problem(8192, 8192, 8192),
     "SPLIT_K=8 needs a 2048 MiB fp32 workspace (SPLIT_K × M×N), more than 1024 MiB"),
    (variant("tma"), problem(1500, 1500, 1500, "fp16"),
     "VARIANT=tma needs rows of a multiple of 16 bytes: fp16 rows of K=1500 and N=1500 elements are not"),
    (variant("tma"), problem(1000, 3004, 2000), "bf16 rows of N=3004 elements are not"),
    (variant("tma", bm=256, bn=256, bk=64, s=3), problem(),
     "VARIANT=tma needs 327680 B of shared memory for its 3-stage A and B tiles and the C tile it stores"),
    (variant("tma", bm=256, bn=256, bk=64, s=3, EPILOGUE_SUBTILE=True), problem(),
     "VARIANT=tma needs 262144 B of shared memory"),  # half the C tile
    (variant("tma_splitk", 1), problem(), "VARIANT=tma_splitk needs SPLIT_K of 2 or more"),
    (variant("tma_splitk", 2), problem(1500, 1500, 1500, "fp16"), "VARIANT=tma_splitk needs rows of a multiple of 16"),
    (variant("tma_splitk", 2, hint=True), problem(3000, 5000, 1000, "fp16"),
     "ALIGN_HINT=True is for pointer loads; VARIANT=tma_splitk loads through tensor descriptors"),
    (variant("tma_splitk", 2, EPILOGUE_SUBTILE=True), problem(), "EPILOGUE_SUBTILE=True is only for VARIANT=tma or "
                                                                 "tma_tail or streamk"),
    (variant("tma_splitk", 2, PAD_ROWS="B"), problem(3000, 5000, 1000, "fp16"),
     "PAD_ROWS=B is only for VARIANT=tma or tma_tail or streamk"),
    (variant("tma_splitk", 2, bn=192), problem(), "BLOCK_SIZE_N=192 (not a power of two) is only for VARIANT=tma"),
    (variant("tma_splitk", 8, bm=128, bn=128, bk=128), problem(1024, 1024, 512),
     "SPLIT_K=8 leaves a split without work: K=512 is 4 block(s) of BLOCK_SIZE_K=128"),
    (variant("tma_splitk", 8, bk=64), problem(8192, 8192, 8192),
     "SPLIT_K=8 needs a 2048 MiB fp32 workspace (SPLIT_K × M×N), more than 1024 MiB"),
    (variant("tma_splitk", 2, bm=256, bn=256, bk=128, s=2), problem(),
     "the 2-stage pipeline needs 262144 B of shared memory"),
    (variant("splitk_fused", 1), problem(), "VARIANT=splitk_fused needs SPLIT_K of 2 or more"),
    (variant("tma_tail", 2), problem(), "SPLIT_K=2 is only for VARIANT=splitk or splitk_fused or tma_splitk"),
    (variant("tma_tail", hint=True), problem(3000, 5000, 1000, "fp16"),
     "ALIGN_HINT=True is for pointer loads; VARIANT=tma_tail loads through tensor descriptors"),
    (variant("streamk", 4), problem(), "SPLIT_K=4 is only for VARIANT=splitk or splitk_fused or tma_splitk"),
    (variant("streamk", hint=True), problem(3000, 5000, 1000, "fp16"),
     "ALIGN_HINT=True is for pointer loads; VARIANT=streamk loads through tensor descriptors"),
    (variant("streamk"), problem(1500, 1500, 1500, "fp16"), "VARIANT=streamk needs rows of a multiple of 16"),
    (variant("streamk", WARP_SPECIALIZE=True), problem(), "WARP_SPECIALIZE=True is only for VARIANT=tma"),
    (variant("tma_tail"), problem(1500, 1500, 1500, "fp16"), "VARIANT=tma_tail needs rows of a multiple of 16"),
    (variant("persistent", EPILOGUE_SUBTILE=True), problem(), "EPILOGUE_SUBTILE=True is only for VARIANT=tma or "
                                                              "tma_tail or streamk"),
    (variant("tma_tail", WARP_SPECIALIZE=True), problem(), "WARP_SPECIALIZE=True is only for VARIANT=tma"),
    (variant("splitk_fused", 8, bm=256, bn=256, bk=64), problem(16384, 16384, 256),
     "SPLIT_K=8 leaves a split without work"),
    (variant("splitk_fused", 4, bm=128, bn=128, bk=64), problem(16384, 16384, 1024),
     "SPLIT_K=4 needs a 4096 MiB fp32 workspace (SPLIT_K × the tiles), more than 1024 MiB"),
])
def test_conditional_parameters_are_constraints_with_a_one_line_reason(cfg: Config, prob: Problem,
                                                                         reason: str) -> None:
    got = FAMILY.space().check(cfg, prob)
    assert got is not None and reason in got and "\n" not in got, got


def test_workspace_of_exactly_the_cap_is_allowed() -> None:
    # 4 × 8192 × 8192 × 4 B = 1024 MiB: at the cap, not over it
    assert FAMILY.space().check(variant("splitk", 4, bk=64), problem(8192, 8192, 8192)) is None


def test_every_variant_has_valid_configs_on_the_issue_shapes() -> None:
    space = FAMILY.space().narrowed({"BLOCK_SIZE_M": [64, 128], "BLOCK_SIZE_N": [64, 128], "BLOCK_SIZE_K": [64],
                                     "GROUP_SIZE_M": [8], "num_warps": [4], "num_stages": [3]})
    every = {"grouped", "splitk", "persistent", "tma", "splitk_fused", "tma_tail", "streamk", "tma_splitk"}
    for prob, variants in ((problem(3000, 5000, 1000, "fp16"), every),
                           (problem(1500, 1500, 1500, "fp16"), {"grouped", "splitk", "persistent", "splitk_fused"}),
                           (problem(1, 4096, 4096), every),
                           (problem(16384, 16384, 256), every - {"splitk", "splitk_fused", "tma_splitk"})):  # 2 GiB
        valid = space.valid(prob)
        assert {c["VARIANT"] for c in valid} == variants, prob.label()
        hinted = {c["ALIGN_HINT"] for c in valid}
        assert hinted == ({False, True} if int(prob["K"]) % 16 else {False}), prob.label()


@pytest.mark.parametrize(("dim", "dtype", "align"), [
    (4096, "bf16", 1), (1000, "fp16", 8), (5000, "fp16", 8), (3000, "bf16", 8), (1500, "fp16", 4), (6, "fp16", 2),
    (1001, "fp16", 1), (24, "bf16", 8)])
def test_alignment_is_what_triton_cannot_see_up_to_16_bytes(dim: int, dtype: str, align: int) -> None:
    assert alignment(dim, dtype) == align


def test_specialisation_separates_the_asserted_alignment_and_the_reduction_length() -> None:
    spec = FAMILY.specialisation
    a, b = problem(3000, 5000, 1000, "fp16"), problem(1500, 1500, 1500, "fp16")
    assert spec(a, variant()) == spec(b, variant())  # no hint: the same kernel
    assert spec(a, variant(hint=True)) != spec(b, variant(hint=True))  # ALIGN 8 vs 4
    assert "ALIGN_K:8 ALIGN_N:8" in spec(a, variant(hint=True))
    assert spec(problem(64, 64, 64), variant("splitk", 2)) != spec(problem(64, 63, 64), variant("splitk", 2))
    assert spec(problem(64, 64, 64), variant()) == spec(problem(64, 64, 64), config())


def test_default_config_names_the_grouped_kernel() -> None:
    cfg = FAMILY.default_config(problem())
    assert (cfg["VARIANT"], cfg["SPLIT_K"], cfg["ALIGN_HINT"]) == ("grouped", 1, False)


def test_kernel_version_covers_every_variant_module() -> None:
    from tilepilot.kernels.matmul import KERNEL_MODULES

    assert set(KERNEL_MODULES) == {"tilepilot.kernels.matmul_triton", "tilepilot.kernels.matmul_splitk_triton",
                                   "tilepilot.kernels.matmul_persistent_triton",
                                   "tilepilot.kernels.matmul_splitk_fused_triton",
                                   "tilepilot.kernels.matmul_pad_triton"}


def test_recorded_dataset_without_variant_keys_replays_as_the_grouped_kernel() -> None:
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    ds = load_dataset(DATA_DIR / "matmul-h100.jsonl.gz", FAMILY)
    p = problem(3000, 5000, 1000, "fp16")
    records = ds.records(p)
    assert len(records) == 162 and {c["VARIANT"] for c in records} == {"grouped"}
    space = ds.space(FAMILY, p)
    assert space.param("VARIANT").choices == ("grouped",) and space.param("SPLIT_K").choices == (1,)
    assert len(space.valid(p)) == sum(r.status.value != "invalid" and accumulator_fits_registers(c, p) is None
                                      for c, r in records.items())


def test_recorded_variants_dataset_is_each_problems_variants_grid_with_cublas(tmp_path: Path) -> None:
    import sys

    from tilepilot.experiments import Status
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset
    from tilepilot.orchestrator.tune import TuneOptions, tune
    from tilepilot.storage.queries import best, open_db

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    path = DATA_DIR / "matmul-variants-h100.jsonl.gz"
    ds = load_dataset(path, FAMILY)
    assert len(ds.problems) == 29
    for p in ds.problems:
        records = ds.records(p)
        assert set(records) == set(record.variants_grid(p)), p.label()
        for c, r in records.items():  # refused configs recorded as invalid, never timed; no failure otherwise
            refused = FAMILY.space().check(c, p)
            if refused is not None and accumulator_fits_registers(c, p) is not None:
                continue  # recorded before that constraint (see the test above)
            assert (refused is None) == (r.status is not Status.INVALID), (p.label(), c.label())
            assert r.status in (Status.OK, Status.INVALID), (p.label(), c.label(), r.message)
        assert ds.baseline(p)[0] == FAMILY.baseline_name and {r.env.device for r in records.values()} == {
            "NVIDIA H100 80GB HBM3"}
    campaign = tmp_path / "c.toml"
    campaign.write_text('[campaign]\nname = "v"\nkernel = "matmul"\nproposer = "rules"\nbudget = 6\nseed = 1\n')
    tune(TuneOptions(campaign=campaign, backend="replay", dataset=path, db=tmp_path / "t.db"))
    with open_db(tmp_path / "t.db") as db:
        winners = best(db, campaign="v")
    assert len(winners) == 29
    for w in winners:
        problem = next(p for p in ds.problems if p.key() == w.problem_key)
        assert w.median_ms == ds.records(problem)[FAMILY.space().parse(w.config)].median_ms


@pytest.mark.parametrize("name, grid", [("matmul-variants-streamk-h100.jsonl.gz", "streamk_grid"),
                                        ("matmul-variants-wide-h100.jsonl.gz", "wide_grid")])
def test_recorded_streamk_and_wide_datasets_are_each_problems_grid_with_cublas(name: str, grid: str) -> None:
    import sys

    from tilepilot.experiments import Status
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    ds = load_dataset(DATA_DIR / name, FAMILY)
    assert {p.key() for p in ds.problems} == {p.key() for p in record.problems_for("matmul", "all")}
    for p in ds.problems:
        records = ds.records(p)
        assert set(records) == set(getattr(record, grid)(p)), p.label()
        for c, r in records.items():  # refused configs recorded as invalid, never timed; no failure otherwise
            assert (FAMILY.space().check(c, p) is None) == (r.status is not Status.INVALID), (p.label(), c.label())
            assert r.status in (Status.OK, Status.INVALID), (p.label(), c.label(), r.message)
        assert ds.baseline(p)[0] == FAMILY.baseline_name
    unaligned = next(p for p in ds.problems if p["K"] == 1500)  # no TMA for 3000-byte rows: all refused
    assert {r.status for r in ds.records(unaligned).values()} == {Status.INVALID}


def test_recorded_narrow_dataset_is_each_decode_problems_grid_with_cublas() -> None:
    import sys

    from tilepilot.experiments import Status
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    ds = load_dataset(DATA_DIR / "matmul-variants-narrow-h100.jsonl.gz", FAMILY)
    decode = record.problems_for("matmul", "decode")
    assert {p.key() for p in ds.problems} == {p.key() for p in decode} and all(p["M"] <= 256 for p in decode)
    assert len(decode) == 8
    for p in ds.problems:
        records = ds.records(p)
        assert set(records) == set(record.narrow_grid(p)), p.label()
        for c, r in records.items():  # refused configs recorded as invalid, never timed; no failure otherwise
            assert (FAMILY.space().check(c, p) is None) == (r.status is not Status.INVALID), (p.label(), c.label())
            assert r.status in (Status.OK, Status.INVALID), (p.label(), c.label(), r.message)
        assert ds.baseline(p)[0] == FAMILY.baseline_name
        assert max(int(c["BLOCK_SIZE_N"]) for c in records) == 32


def test_the_tuned_arms_finalists_hold_each_recorded_variants_fastest_config() -> None:
    import sys

    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import kernels  # type: ignore[import-not-found]

    paths = [DATA_DIR / "matmul-variants-h100.jsonl.gz"]
    ds = load_dataset(paths[0], FAMILY)
    finalists = kernels.tuned_finalists("matmul", paths)
    for p in ds.problems[:4]:
        timed = sorted(((r.median_ms, c) for c, r in ds.records(p).items() if r.median_ms is not None),
                       key=lambda x: (x[0], x[1].key()))
        fastest: dict[str, object] = {}
        for _, c in timed:
            fastest.setdefault(c["VARIANT"], c)
        chosen = finalists[p.key()]
        assert chosen[0] == timed[0][1]  # the fastest recorded config first
        assert set(fastest.values()) <= set(chosen), p.label()  # and every variant's best, not only the top two
        assert len(fastest) > kernels.FINALISTS


def test_recorded_pad_dataset_is_each_unaligned_problems_grid_with_cublas() -> None:
    import sys

    from tilepilot.experiments import Status
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    ds = load_dataset(DATA_DIR / "matmul-variants-pad-h100.jsonl.gz", FAMILY)
    assert {p.label() for p in ds.problems} == {"M=3000 N=5000 K=1000 fp16", "M=1000 N=3000 K=2000 bf16"}
    for p in ds.problems:
        records = ds.records(p)
        assert set(records) == set(record.pad_grid(p)) and len(records) == 252, p.label()
        for c, r in records.items():  # refused configs recorded as invalid, never timed; no failure otherwise
            assert (FAMILY.space().check(c, p) is None) == (r.status is not Status.INVALID), (p.label(), c.label())
            assert r.status in (Status.OK, Status.INVALID), (p.label(), c.label(), r.message)
        assert ds.baseline(p)[0] == FAMILY.baseline_name
        assert {c["PAD_ROWS"] for c in records} == {"A", "B", "AB"}


def test_recorded_group_dataset_is_each_problems_tuned_config_at_three_tile_orders() -> None:
    import sys

    from tilepilot.experiments import Status
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    ds = load_dataset(DATA_DIR / "matmul-variants-group-h100.jsonl.gz", FAMILY)
    assert {p.key() for p in ds.problems} == {p.key() for p in record.problems_for("matmul", "all")}
    for p in ds.problems:
        records = ds.records(p)
        assert sorted(c["GROUP_SIZE_M"] for c in records) == [1, 4, 16], p.label()
        rest = {tuple((k, v) for k, v in c.items() if k != "GROUP_SIZE_M") for c in records}
        assert len(rest) == 1, p.label()  # one config, three tile orders
        assert all(r.status is Status.OK for r in records.values()), p.label()
        assert ds.baseline(p)[0] == FAMILY.baseline_name


def test_group_grid_is_the_tables_tuned_config_at_the_other_tile_orders() -> None:
    import json
    import sys

    from tilepilot.orchestrator.replay import DATA_DIR

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    rows = json.loads(record.GROUP_TABLE.read_text())["rows"]
    row = next(r for r in rows if r["kernel"] == "matmul")
    p = FAMILY.parse_problem(row["problem"])
    grid = record.group_grid(p)
    assert [c["GROUP_SIZE_M"] for c in grid] == [1, 4, 16]
    assert all({**c.as_dict(), "GROUP_SIZE_M": 8} == {**row["arms"]["tuned"]["config"], "GROUP_SIZE_M": 8}
               for c in grid)
    assert record.group_grid(problem(96, 96, 96)) == []  # not in the table


def test_each_only_flag_of_record_records_its_own_grid() -> None:
    import sys

    from tilepilot.orchestrator.replay import DATA_DIR

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    assert record.only_grid(record.parser().parse_args([])) is None
    flags = {"--new-only": record.new_variants_grid, "--streamk-only": record.streamk_grid,
             "--wide-only": record.wide_grid, "--narrow-only": record.narrow_grid, "--pad-only": record.pad_grid,
             "--group-only": record.group_grid, "--tma-splitk-only": record.tma_splitk_grid}
    for flag, grid_of in flags.items():
        assert record.only_grid(record.parser().parse_args([flag])) is grid_of, flag


def test_recorded_tma_splitk_dataset_is_each_problems_tma_splitk_grid() -> None:
    import sys

    from tilepilot.experiments import Status
    from tilepilot.orchestrator.replay import DATA_DIR, load_dataset

    sys.path.insert(0, str(DATA_DIR.parents[1] / "bench"))
    import record  # type: ignore[import-not-found]

    ds = load_dataset(DATA_DIR / "matmul-variants-tmasplitk-h100.jsonl.gz", FAMILY)
    assert len(ds.problems) == 29
    for p in ds.problems:
        records = ds.records(p)
        assert set(records) == set(record.tma_splitk_grid(p)), p.label()
        for c, r in records.items():
            assert (FAMILY.space().check(c, p) is None) == (r.status is Status.OK), (p.label(), c.label(), r.message)
