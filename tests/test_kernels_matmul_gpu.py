"""The matmul variants on a real GPU: every variant correct in bf16 and fp16 on the recorded
problems that motivated it and on ragged shapes; split-K giving the same bits on every run; the
split-K workspace and the TMA descriptors' scratch allocated when the launch is built, not in the
timed closure, which CUDA graphs can capture; a persistent launch of one program per SM; the
variant kernels compiled ahead of time being the kernels the JIT builds; ALIGN_HINT making
the unaligned 3000×5000×1000 fp16 problem several times faster; and PAD_ROWS: correct, its copies
made in buffers set aside when the launch is built (NaN in their padding columns changes nothing),
captured by CUDA graphs, and faster than the tma kernel on the operands as they are there; split-K
on tensor descriptors (tma_splitk) faster than tma_tail's last-arriver sum on a long K."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tilepilot.experiments import Config, Problem, Status

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3}


def cfg(variant: str, bm: int = 128, bn: int = 128, bk: int = 64, w: int = 4, s: int = 3, split: int = 1,
        hint: bool = False, g: int = 8, subtile: bool = False, pad: str = "none") -> Config:
    return Config.of({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
                      "num_warps": w, "num_stages": s, "VARIANT": variant, "SPLIT_K": split, "ALIGN_HINT": hint,
                      "EPILOGUE_SUBTILE": subtile, "PAD_ROWS": pad})


def prob(m: int, n: int, k: int, dtype: str) -> Problem:
    return Problem.of({"M": m, "N": n, "K": k, "dtype": dtype})


VARIANT_CONFIGS = [
    cfg("grouped", hint=True), cfg("splitk", 64, 64, 64, split=2), cfg("splitk", 16, 64, 128, split=4, hint=True),
    cfg("persistent"), cfg("persistent", 128, 256, 64, w=8, hint=True), cfg("tma"), cfg("tma", 64, 64, 32, s=4),
    cfg("tma", 128, 256, 64, w=8, subtile=True), cfg("splitk_fused", 16, 64, 128, split=4, hint=True),
    cfg("splitk_fused", 64, 128, 64, split=2), cfg("tma_tail"), cfg("tma_tail", 128, 256, 64, w=8, subtile=True),
    cfg("streamk"), cfg("streamk", 256, 128, 64, w=8, subtile=True), cfg("tma", 128, 192, 64, w=8),
    cfg("tma", 256, 160, 32, w=8, s=4), cfg("tma", pad="B"), cfg("tma", 128, 256, 64, w=8, subtile=True, pad="AB"),
    cfg("tma_tail", pad="A"), cfg("streamk", pad="AB"), cfg("tma", 128, 192, 64, w=8, pad="B"),
    cfg("tma_splitk", 128, 256, 64, w=8, s=4, split=4), cfg("tma_splitk", 64, 128, 128, s=4, split=2)]
PROBLEMS = [prob(33, 47, 65, "fp16"), prob(33, 40, 72, "bf16"), prob(1, 4096, 4096, "bf16"),
            prob(3000, 5000, 1000, "fp16"), prob(1000, 3000, 2000, "bf16"), prob(1500, 1500, 1500, "fp16"),
            prob(16384, 16384, 256, "bf16")]


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Any]:
    from tilepilot.kernels.evaluate import Evaluator

    yield Evaluator("gpu", rounds=2, block_ms=2.0, outclass_ratio=None)  # every config timed


@pytest.fixture(scope="module")
def family() -> Any:
    from tilepilot.kernels import get_family

    return get_family("matmul")


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label())
def test_every_variant_is_correct_on_gpu(evaluator: Any, family: Any, problem: Problem,
                                         record_property: Any) -> None:
    space = family.space()
    configs = [c for c in VARIANT_CONFIGS if space.check(c, problem) is None]
    assert configs
    results = evaluator.evaluate("matmul", problem, configs)
    for r in results:
        assert r.status is Status.OK, (r.config.label(), r.message)
        assert 0 < r.max_rel_err < TOLERANCE[str(problem["dtype"])], (r.config.label(), r.max_rel_err)
        assert r.timing.median_ms > 0 and r.extra["shared_bytes"] > 0
        record_property(f"{r.config['VARIANT']} {r.config.label()}", f"{r.median_ms:.5g} ms err {r.max_rel_err:.3g}")
    assert {r.config["VARIANT"] for r in results} >= {"persistent"}


def _built(family: Any, problem: Problem, config: Config) -> tuple[Any, tuple[Any, ...], Any]:
    from tilepilot.kernels.evaluate import Evaluator

    inputs = family.make_inputs(problem, 0, "cuda")
    out = family.make_output(problem, inputs)
    compiled = family.compile(problem, config, Evaluator("gpu").target())
    return family.launcher(problem, config, inputs, out, compiled), inputs, out


@pytest.mark.parametrize("config", [cfg("splitk", 64, 128, 64, split=4, hint=True),
                                    cfg("splitk_fused", 64, 128, 64, split=4, hint=True),
                                    cfg("splitk_fused", 16, 64, 64, split=16, hint=True), cfg("tma_tail"),
                                    cfg("streamk"), cfg("streamk", 256, 128, 64, w=8),
                                    cfg("tma_splitk", 128, 256, 64, w=8, split=4)],
                         ids=lambda c: f"{c['VARIANT']}-{c['SPLIT_K']}-{c['BLOCK_SIZE_M']}")
def test_splitk_gives_the_same_bits_on_every_run(family: Any, config: Config) -> None:
    # 192 tiles of 128×128: tma_tail splits the last 60 in two, streamk cuts their 1920 K-blocks into
    # 132 ranges of 15; 96 tiles of 256×128: streamk cuts all 3072 into ranges of 24
    problem = prob(1000, 3000, 2000, "bf16")
    run, _, out = _built(family, problem, config)
    outs = []
    for _ in range(5):
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        outs.append(out.clone())
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert not outs[0].isnan().any()


def _allocates_nothing_and_replays(family: Any, problem: Problem, run: Any, inputs: tuple[Any, ...],
                                   out: Any) -> None:
    """`run` allocates nothing once warm (its buffers were set aside when it was built), and a CUDA
    graph that captured it writes the right result into `out` (NaN before the replay)."""
    run()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == before  # workspace and scratch were set aside when built
    ref = family.reference(problem, inputs)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        run()  # warm-up on the capture stream
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            run()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert float((out.float() - ref).norm() / ref.norm()) < TOLERANCE["bf16"]


@pytest.mark.parametrize("config", [cfg("splitk", 64, 128, 64, split=4), cfg("tma"), cfg("persistent"),
                                    cfg("splitk_fused", 64, 128, 64, split=4), cfg("tma_tail"), cfg("streamk"),
                                    cfg("tma", 128, 192, 64, w=8), cfg("tma_splitk", 128, 128, 64, w=8, split=2)],
                         ids=lambda c: str(c["VARIANT"]))
def test_launch_allocates_nothing_and_is_captured_by_a_cuda_graph(family: Any, config: Config) -> None:
    problem = prob(512, 1024, 2048, "bf16")
    run, inputs, out = _built(family, problem, config)
    _allocates_nothing_and_replays(family, problem, run, inputs, out)


def test_persistent_launch_is_one_program_per_sm(family: Any) -> None:
    from tilepilot.kernels.matmul import _programs

    a = torch.empty(1, device="cuda")
    assert _programs(a) == torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("config", [cfg("persistent", hint=True), cfg("splitk", 64, 64, 64, split=2, hint=True),
                                    cfg("tma"), cfg("splitk_fused", 64, 64, 64, split=2, hint=True),
                                    cfg("tma_tail", subtile=True), cfg("streamk"), cfg("tma", 128, 192, 64, w=8),
                                    cfg("tma_splitk", 128, 256, 64, w=8, split=4)],
                         ids=lambda c: f"{c['VARIANT']}-{c['BLOCK_SIZE_N']}")
def test_aot_variant_kernel_is_the_kernel_the_jit_builds(family: Any, config: Config) -> None:
    import triton

    from tilepilot.kernels.evaluate import Evaluator
    from tilepilot.kernels.matmul import _descriptors, _kernel, descriptor_blocks

    problem = prob(3000, 5000, 1000, "fp16")
    aot = family.compile(problem, config, Evaluator("gpu").target())
    aot = getattr(aot, "main", aot)
    fn, ints, constexprs = _kernel(problem, config)
    a, b = family.make_inputs(problem, 0, "cuda")
    c = torch.empty((3000, 5000), dtype=torch.float16, device="cuda")
    buffers = {"a_ptr": a, "b_ptr": b, "c_ptr": c, "ws_ptr": torch.empty(2**25, dtype=torch.float32, device="cuda"),
               "lock_ptr": torch.zeros(2**12, dtype=torch.int32, device="cuda")}
    args = {n: buffers[n] for n in fn.arg_names if n.endswith("_ptr")}
    args.update(_descriptors(descriptor_blocks(config), {"a": a, "b": b, "c": c}))  # the tma variants' host descriptors
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    jit = fn[(1, 1, 1)](**args, **ints, **constexprs, num_warps=int(config["num_warps"]),
                        num_stages=int(config["num_stages"]))
    assert aot.asm["ptx"] == jit.asm["ptx"]


def test_align_hint_makes_the_unaligned_problem_several_times_faster(evaluator: Any,
                                                                     record_property: Any) -> None:
    problem = prob(3000, 5000, 1000, "fp16")
    plain, hinted = evaluator.evaluate("matmul", problem, [cfg("grouped"), cfg("grouped", hint=True)])
    assert plain.status is Status.OK and hinted.status is Status.OK, (plain.message, hinted.message)
    record_property("plain_ms", plain.median_ms)
    record_property("hinted_ms", hinted.median_ms)
    assert hinted.median_ms < plain.median_ms / 2, (plain.median_ms, hinted.median_ms)


@pytest.mark.parametrize("config", [cfg("tma", pad="AB"), cfg("tma_tail", 128, 256, 64, w=8, subtile=True, pad="B")],
                         ids=lambda c: f"{c['VARIANT']}-{c['PAD_ROWS']}")
def test_padded_launch_sets_its_copies_aside_and_is_captured_by_a_cuda_graph(family: Any, config: Config) -> None:
    from tilepilot.kernels import matmul

    problem = prob(1000, 3000, 2000, "bf16")  # rows of 4000 and 6000 bytes
    matmul._shared(matmul._PADDED, 64 << 20, "uint8", "cuda").fill_(255)  # NaN in every padding column
    run, inputs, out = _built(family, problem, config)
    before_inputs = [t.clone() for t in inputs]
    _allocates_nothing_and_replays(family, problem, run, inputs, out)
    assert all(torch.equal(a, b) for a, b in zip(before_inputs, inputs, strict=True))


def test_padding_b_makes_the_unaligned_problem_faster(evaluator: Any, record_property: Any) -> None:
    # B's rows of 10000 bytes start off 128-byte boundaries; bench/results/pad-probe-h100.json: 0.078 -> 0.068 ms
    problem = prob(3000, 5000, 1000, "fp16")
    plain, padded = evaluator.evaluate("matmul", problem, [cfg("tma", 128, 256, 64, w=8, subtile=True),
                                                           cfg("tma", 128, 256, 64, w=8, subtile=True, pad="B")])
    assert plain.status is Status.OK and padded.status is Status.OK, (plain.message, padded.message)
    record_property("plain_ms", plain.median_ms)
    record_property("padded_ms", padded.median_ms)
    assert padded.median_ms < 0.95 * plain.median_ms, (plain.median_ms, padded.median_ms)


def test_split_k_on_descriptors_beats_the_last_arrivers_sum_on_a_long_k(evaluator: Any, record_property: Any) -> None:
    # 32 tiles of 128×256, K=16384: tma_tail splits each in 4 and the last of the 4 to arrive sums the
    # partials alone; tma_splitk's reduction is a launch over every SM. bench/results/tma-splitk-probe-h100.json:
    # 0.0716 against 0.0594 ms
    problem = prob(1024, 1024, 16384, "bf16")
    tail, split = evaluator.evaluate("matmul", problem, [cfg("tma_tail", 128, 256, 64, w=8, s=3),
                                                         cfg("tma_splitk", 128, 256, 64, w=8, s=4, split=4)])
    assert tail.status is Status.OK and split.status is Status.OK, (tail.message, split.message)
    record_property("tma_tail_ms", tail.median_ms)
    record_property("tma_splitk_ms", split.median_ms)
    assert split.median_ms < 0.92 * tail.median_ms, (tail.median_ms, split.median_ms)
