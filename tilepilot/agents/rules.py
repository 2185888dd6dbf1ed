"""`rules`: an offline expert. A cost model ranks the configs; measurements correct it.

Before any result, configs are ranked by the tile model's predicted time (`tile_model`:
shared memory and registers against the device's limits, waves over the SMs, padding, the
roofline). Configs the resource model says cannot launch are never proposed. After results
arrive, a Gaussian process over the model's log-error (`residual_gp`) corrects the
prediction of every unmeasured config: a per-problem offset and a smooth correction, so a
region whose neighbours ran slow drops and one that beat the model rises. Learned failure
regions: an `out_of_resources` result ranks every config that needs at least as much shared
memory after all others; other failures that never run (compile error, crash, wrong result)
penalise the configs that differ from the failed one in num_stages alone (4x their predicted
time in the ranking): the same tile shape and warps, and the same value of every parameter outside
the tile (a kernel variant, a flag), since a failure of one code path says nothing of another. A
crash injected through such a parameter (bench/gpu_campaign.py's FAULT=oob at 128x128x64 with 4
warps) had ranked that tile down for every campaign problem, the optimum of several among them.
Neither is dropped, so the search stays exhaustive.

Each batch is picked greedily by the lower confidence bound of the corrected prediction;
each pick is then added to the GP as if measured at its mean, which spreads a batch out.
Every `neighbour_every`-th pick is a local step instead (a pattern search around the incumbent,
as Helion's autotuner does): among the untried configs one parameter away from the best result
so far (the next choice up or down), the one with the best corrected score. The model can be
wrong about a whole region (on 3000x5000x1000 fp16 it put 64-wide N tiles 40% slower than 128,
the reverse of the measurements), and a neighbour of the best measured config is where a model
error costs most.
Untried values: once results are in, where every config measured or in flight shares one value of
a tile parameter (block sizes, warps, stages; not an inert one) that the pool holds others of, one
pick of the batch is the best-scored config with another value, and its rationale says which
("tests num_warps=4: every config measured so far has num_warps=8"). Otherwise a model that prefers
one value for every tile can spend a small budget without once testing the preference: on
3000x5000x1000 fp16 it ranks 8 warps first for every tile, its 8 picks all had 8 warps, and the
fastest configs all have 4.
History: where the store holds results of a problem whose operands load the same way (the
tile model's regimes, `element_wise_operands`: both vectorised, or A, B or both element by
element), the nearest TRANSFER_SOURCES (5) such problems (log-shape distance d) correct the model
before this problem's first result, by the mean of their corrections weighed by 1/d² (d from
TRANSFER_NEAR up); the problem itself, measured on a sibling device by an earlier campaign, stands
alone. Its own earlier results on this device are
not read as a correction: as one they cost more than they gave (bench/retune.py: after an Optuna or a
random campaign of 8 configs on the same problem, 8 configs of `rules` corrected by that campaign's
results found fewer problems within 2% than the model alone, README "Re-tuning a problem the store
holds"); the driver reuses them instead, as results of the campaign's own, where `rules` proposes
their configs. One source was the rule before: on a fresh
H200 set held out from the choice (README, "A third fresh set on the H200"), three gave as many
problems within 2% at 8 configs and no higher a median of configs to 2%, as decided in advance
(bench/results/matmul-h200-fresh3-plan.json). The mean of the three was the rule after: with every
other recorded grid in the store, the weighted five put the first config within 2% of the optimum
on 123 of the grids' 191 problems against 112, and took at most half of cold's configs on 11 of 12
grids against 9 (bench/results/warm-start-allgrids-screen.json); on a ninth fresh H200 set recorded
to decide it, as many problems within 2% and no higher a median, as decided in advance
(bench/results/matmul-h200-fresh9-plan.json). Results
of a sibling device (`roofline.SIBLINGS`: the same chip with other memory, as the H200 is to the
H100 SXM) count too, one unit farther (in quadrature, as a differing element size). Results of
another kernel version (`ProposerContext.kernel_version`: the kernel's source changed since) stand
as near as the campaign's own, and come after them only at equal distance; the note names such a
source. Weighing them one unit farther, as a sibling's, changed the source of about a quarter of the
problems of the recorded grids and left the warm start where it was (README, "Results of another
kernel version"): the nearer neighbour counts for more than the version. Each source's
residuals (log measured over modelled, less their median) fitted by a GP with the noise
`TRANSFER_NOISE_VAR` predict a correction for every config. The model errs alike on
problems of one regime: with constants fitted on neither, the element-wise 1500x1500x1500 and
3000x5000x1000 fp16 run 128x64x32 with 4 warps 2.1x and 2.4x faster than modelled, and on both
it is the fastest config.
Learnings: a validated learning in scope ("p=a is E times as fast as p=b", from the ledger: a
geometric mean over paired configs, with a 95% interval [L, H]) moves every config with p=b (whose
p=a twin is in the space) later by one shift: what raises the model's (history-corrected) mean
log-gap between such configs and their twins to log L, nothing where it is already that wide. The
learning is a mean over pairs, and L is what its evidence vouches for; the model keeps which pairs
it puts farther apart. Ranking every p=b config at least E behind its twin, as before, cost the
warm start: a learning holds on average over its scope, and the optimum of a problem in it can take
the losing value ("num_stages=4 is 1.31x as fast as 3 when K >= 5120" on the H200, from 5 pairs on
5 problems; 1536x1536x6144 fp16 runs fastest with 3 stages). Through whole campaigns with every
other grid in the store (bench/warm_campaigns.py, README "Learnings as priors"), on seven grids
92 of 98 problems within 2% at 8 configs against 89, mean regret 3.04 against 6.28 (the grids'
sum); on a sixth fresh H200 set, recorded to decide by a rule written first, 15 of 16 both, 0.37%
against 0.38%.
Each candidate carries `predicted_ms` and a one-line rationale: the reason from the model and
a falsifiable hypothesis (the time range it expects). A row-wise kernel's space (softmax, rmsnorm,
layernorm: BLOCK_SIZE, ROWS_PER_PROGRAM, num_warps, num_stages over rows × cols) is ranked by the row
model (`row_model`: each program's chain of loads, the bytes streamed, the instructions issued)
instead; the history corrects it as it does the tile model, from the store's row-wise problems
whose rows fit a block where this problem's do (or need two passes where these do), nearest by the
log2 ratios of rows and cols; learnings do not move it. Flash attention's space (BLOCK_M, BLOCK_N,
num_warps, num_stages over B, H, S, D, causal) is ranked by the attention model (`attention_model`:
the programs resident on an SM, a key step's work on the SM's pipes against one program's step in
sequence, the loads its stages leave exposed), corrected alike from the store's problems of the same
causality (`space_models`). Other spaces without tile parameters get no model (a flat prior) and the
GP alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tilepilot.agents.base import Proposer, ProposerContext, ProposerRecords, SearchState
from tilepilot.agents.residual_gp import GpSettings, ResidualGp
from tilepilot.agents.roofline import H100_SXM, Device, gemm_dims, problem_roofline, siblings
from tilepilot.agents.rules_text import describe
from tilepilot.agents.space_models import SpaceEstimate, SpaceModel, space_model
from tilepilot.agents.tile_model import (
    ALIASES,
    ROWS_MASKED_VARIANTS,
    TILE_NAMES,
    VARIANT,
    Constants,
    Estimate,
    Tile,
    configured_constants,
    element_wise_operands,
    estimate_tile,
    tile_from,
    tile_of,
)
from tilepilot.experiments import Candidate, Config, Problem, Result, SearchSpace, Status, same_value

log = logging.getLogger(__name__)

OUT_OF_RESOURCES_PENALTY = math.log(1e6)  # ranks a config last
FAILED_SHAPE_PENALTY = math.log(4.0)  # added to the log-prediction of a config near a failure
PREDICT_ROWS = 16384  # the GP predicts the pool in chunks of this many configs (bounded memory)
TRANSFER_NOISE_VAR = 0.05  # log units²: how loosely another problem's residual stands for this one's
TRANSFER_MIN_RESULTS = 4  # results a problem of the store needs before its residuals are read
TRANSFER_MAX_RESULTS = 256  # at most this many of them (every k-th by config) feed the GP: its cost is cubic
TRANSFER_SOURCES = 5  # the nearest problems of the store whose corrections are averaged (see the module docstring)
TRANSFER_NEAR = 0.25  # a source nearer than this (log-shape distance) weighs as one this near


@dataclass(frozen=True)
class RulesSettings:
    kappa: float = 1.0  # lower confidence bound: corrected log-prediction - kappa * std
    signal_var: float = 0.2  # prior variance of the model's log-error between configs
    offset_var: float = 0.05  # prior variance of the model's log-error common to the problem
    noise_var: float = 0.02**2
    lengthscales: dict[str, float] = field(default_factory=lambda: {
        "BLOCK_SIZE_M": 0.8, "BLOCK_M": 0.8, "BLOCK_SIZE_N": 0.8, "BLOCK_N": 0.8,
        "BLOCK_SIZE_K": 1.0, "BLOCK_K": 1.0, "num_warps": 1.0, "num_stages": 1.5})
    default_lengthscale: float = 1.0  # in steps between adjacent choices of a parameter
    neighbour_every: int = 4  # every n-th pick steps from the incumbent (0: never)
    neighbour_after: int = 4  # measured results before the first local step
    # once results are in, one pick a batch takes a value of a tile parameter that every measured
    # config shares: the model's preference for that value is tested, not assumed
    test_untried: bool = True


class RulesProposer(Proposer):
    name = "rules"

    def __init__(self, ctx: ProposerContext, *, device: Device = H100_SXM,
                 constants: Constants | None = None, settings: RulesSettings | None = None) -> None:
        super().__init__(ctx)
        self.device = device
        self.constants = constants or configured_constants()
        self.settings = settings or RulesSettings()
        self.roofline = problem_roofline(ctx.problem, device)
        self._device_note = ("" if not ctx.device or "H100" in ctx.device
                             else f"; ceilings of {device.name} assumed, results from {ctx.device}")
        self._results: dict[Config, Result] = {}
        self._pool: _Pool | None = None  # valid configs the model lets launch, in prior order
        self._est: dict[Tile, Estimate] = {}  # the tile model's estimate of each tile seen
        self._modelled = gemm_dims(ctx.problem) is not None
        # a row-wise kernel's space (softmax, rmsnorm, layernorm) or flash attention's: its own model
        # (`space_models`) ranks it instead
        self._space_model: SpaceModel | None = None if self._modelled else space_model(
            ctx.kernel, ctx.space, ctx.problem, device)
        self._space_est: dict[tuple[object, ...], SpaceEstimate] = {}
        # each parameter's choices -> position (a value matches a choice of its own type only)
        self._positions = [(p.name, {(type(c), c): i for i, c in enumerate(p.choices)}) for p in ctx.space.params]
        inert = _inert(ctx.problem, ctx.space)
        self._scales = tuple(math.inf if p.name in inert else
                             self.settings.lengthscales.get(p.name, self.settings.default_lengthscale)
                             for p in ctx.space.params)
        self._grades = [_grades(p.choices) for p in ctx.space.params]  # choice index -> distance position
        self._smem_cap: int | None = None  # least shared memory seen to fail with out_of_resources
        self._picks = 0  # proposals made, for the local-step rhythm
        self._bad_shapes: set[tuple[tuple[str, object], ...]] = set()  # _failure_key of configs that failed to run
        self._transfers: list[ResidualGp] = []  # a GP over each source problem's residuals, nearest first
        self._weights: list[float] = []  # each source's weight in the correction (`_source_weight`)
        # the problems the correction comes from, their results, and the sibling device they ran on ("": this one)
        self._sources: list[tuple[Problem, int, str]] = []
        self._shifts: dict[Config, float] = {}  # the correction of each config asked for
        self._transfer_read = False
        self._notes: list[str] = []
        # learnings in scope: id, param, a, b, effect and the low end of its 95% interval
        self._rules: list[tuple[str, str, object, object, float, float]] | None = None
        self._deltas: dict[str, float] | None = None  # each learning's shift of the configs it loses (log units)
        self._learned: dict[Config, tuple[float, str]] = {}  # a config's learned log-shift and its learning

    # ---- the contract --------------------------------------------------------------
    def propose(self, state: SearchState, n: int) -> list[Candidate]:
        self._absorb(state)
        pool = self._pool_of()
        alive = self._unseen(pool, state.seen)  # rows of the pool not yet measured, in prior order
        if n <= 0 or not len(alive):
            return []
        picked = set(state.seen)
        alive = self._unknown(pool, alive, picked)
        gp = ResidualGp(self._gp_settings())
        xs, ys = self._training()
        gp.fit(xs, ys)
        measured = len(xs)
        self._believe_pending(gp, xs, ys, state.pending)
        best = state.best()
        out: list[Candidate] = []
        # one pick of this batch takes a value no measured config has; once there is none to take,
        # the batch's picks (more values seen, fewer configs left) cannot make one
        tested = False
        for _ in range(min(n, len(alive))):
            self._picks += 1
            local = self._local_step(pool, alive, best, measured)
            untried = None
            if local is None and not tested and measured >= self.settings.neighbour_after:
                untried = self._untried(pool, alive, state.pending | {c.config for c in out})
                tested = untried is None
            i, mean, std = self._pick(gp, pool, alive, local if untried is None else untried[0])
            row = int(alive[i])
            alive = np.delete(alive, i)
            config = pool.configs[row]
            picked.add(config)
            alive = self._unknown(pool, alive, picked)  # nor an inert sibling of it in this batch
            predicted = math.exp(self._log_model(config) + mean)
            known = self.estimate(config) is not None or self.space_estimate(config) is not None or measured > 0
            why = self._why(config, predicted, std, best, measured)
            if local is not None and best is not None:
                why = f"local step from the best so far ({best.config.label()}); {why}"
            if untried is not None:
                tested = True
                why = f"{self._untried_why(pool.steps[row], untried[1])}; {why}"
            out.append(Candidate(self.ctx.problem, config, self.name, why,
                                 predicted_ms=predicted if known else None))
            xs.append(tuple(float(v) for v in pool.coords[row]))
            ys.append(mean)  # believe the mean: the next pick looks elsewhere
            gp.fit(xs, ys)
        return out

    def observe(self, results: Sequence[Result]) -> None:
        for r in results:
            self._check_problem(r)
            if self._results.get(r.config) == r:
                continue
            self._results[r.config] = r
            self._learn_failure(r)

    def score(self, configs: Sequence[Config]) -> list[tuple[float | None, str]]:
        """The corrected prediction (tile model × the GP's mean over measured results) of each
        config; a config near a failure is predicted slow by its penalty (see the module docstring)."""
        xs, ys = self._training()
        gp = ResidualGp(self._gp_settings())
        gp.fit(xs, ys)
        coords = [self._coords(c) for c in configs]
        inside = [i for i, x in enumerate(coords) if x is not None]
        means, _ = gp.predict([coords[i] for i in inside]) if inside else ([], [])
        out: list[tuple[float | None, str]] = [(None, "")] * len(configs)
        for i, mean in zip(inside, means, strict=True):
            config = configs[i]
            modelled = self.estimate(config) is not None or self.space_estimate(config) is not None
            if not modelled and not xs:
                continue  # no model and nothing measured: no prediction
            predicted = math.exp(self._log_model(config) + float(mean))
            model = self._model_name()
            basis = (model if modelled else "measured neighbours") + (
                f" with the results of {self._source_label()}" if self._sources else "") + (
                f" corrected by {len(xs)} result{'s' if len(xs) != 1 else ''}" if xs else ", nothing measured yet")
            reason = f"rules predicts {predicted:.3g} ms ({basis})"
            penalty = self._penalty(config)
            if penalty:
                reason += "; ranked down: near a config that failed to run"
            out[i] = (predicted * math.exp(penalty), reason)
        return out

    def best_prediction(self) -> float | None:
        """The corrected prediction of the pool's first config (the model's, the history's and the
        failures' ranking; the GP's correction once results arrive is not in it)."""
        pool = self._pool_of()
        if not (self._modelled or self._space_model) or not len(pool.configs):
            return None
        return math.exp(float(pool.prior[0]))

    def drain_records(self) -> ProposerRecords:
        notes, self._notes = tuple(self._notes), []
        return ProposerRecords(notes=notes)

    # ---- the model -----------------------------------------------------------------
    def estimate(self, config: Config) -> Estimate | None:
        """The tile model's estimate of a config, None in a space without a tile model."""
        return self._estimate_tile(tile_of(config))

    def _estimate_tile(self, tile: Tile | None) -> Estimate | None:
        """The estimate depends on the problem and the tile alone: one per distinct tile."""
        if tile is None or not self._modelled:
            return None
        est = self._est.get(tile)
        if est is None:
            est = self._est[tile] = estimate_tile(self.ctx.problem, tile, self.device, self.constants)
        return est

    def prior_ms(self, config: Config) -> float:
        """The model's time before any measurement (1.0 in a space without a tile model)."""
        return math.exp(self._log_model(config))

    def space_estimate(self, config: Config) -> SpaceEstimate | None:
        """The space model's estimate of a config (a `RowEstimate`, an `AttentionEstimate`), None in a
        space no such model reads."""
        model = self._space_model
        if model is None:
            return None
        key = model.key(config)
        est = self._space_est.get(key)
        if est is None:
            est = self._space_est[key] = model.estimate(self.ctx.problem, config)
        return est

    def _model_name(self) -> str:
        return self._space_model.name if self._space_model is not None else "tile model"

    def _log_model(self, config: Config) -> float:
        est = self.estimate(config)
        if est is None:
            other = self.space_estimate(config)
            return 0.0 if other is None or not other.launches else math.log(other.predicted_ms) + self._shift(config)
        return self._log_corrected(est, config) + self._learned_shift(config)[0]

    def _log_corrected(self, est: Estimate, config: Config) -> float:
        """The model's log-time of a config corrected by the history (not by the learnings)."""
        return math.log(est.predicted_ms) + self._shift(config)

    # ---- learnings -----------------------------------------------------------------
    def _read_learnings(self) -> list[tuple[str, str, object, object, float, float]]:
        """The validated learnings of the ledger whose scope holds this problem and whose
        parameter is in the space, with an effect whose 95% interval lies above 1: (learning id,
        param, a, b, effect, the interval's low end), once; none in a cold start (no history: the
        store is not read)."""
        if self._rules is None:
            self._rules = []
            ledger, p = self.ctx.ledger, self.ctx.problem
            if ledger is not None and self.ctx.history is not None and self._modelled:  # not cold
                names = {q.name for q in self.ctx.space.params}
                statements = {r.hypothesis.id: r
                              for r in ledger.hypotheses(kernel=self.ctx.kernel, device=self.ctx.device or None)}
                for row in ledger.learnings(kernel=self.ctx.kernel, device=self.ctx.device or None):
                    stated = statements.get(row.learning.hypothesis_id)
                    if stated is None:
                        continue
                    h, low = stated.hypothesis, stated.ci_low
                    if (h.param in names and row.learning.scope.contains(p) and row.learning.effect > 1.0
                            and low is not None and low > 1.0):
                        self._rules.append((row.learning.id, h.param, h.a, h.b, row.learning.effect, low))
        return self._rules

    def _twin(self, config: Config, param: str, a: object, b: object) -> tuple[Estimate, Config, Estimate] | None:
        """For a config with `param` = b: its estimate, its twin with `param` = a and the twin's
        estimate, where both launch and the twin is in the space; None otherwise."""
        est = self.estimate(config)
        if est is None or not est.launches or not same_value(config.get(param), b):
            return None
        twin = Config.of({**config.as_dict(), param: a})
        twin_est = self.estimate(twin)
        if twin_est is None or not twin_est.launches or self.ctx.space.check(twin, self.ctx.problem) is not None:
            return None
        return est, twin, twin_est

    def _learning_deltas(self, configs: Sequence[Config]) -> dict[str, float]:
        """Each learning's shift (see the module docstring): the model's (history-corrected) mean
        log-gap between the configs of `configs` that lose it and their twins, raised to the log of the
        low end of the learned effect's interval; 0 where the model's mean gap is already that wide."""
        deltas: dict[str, float] = {}
        for lid, param, a, b, _, low in self._read_learnings():
            gaps = []
            for c in configs:
                pair = self._twin(c, param, a, b)
                if pair is not None:
                    est, twin, twin_est = pair
                    gaps.append(self._log_corrected(est, c) - self._log_corrected(twin_est, twin))
            deltas[lid] = max(0.0, math.log(low) - float(np.mean(gaps))) if gaps else 0.0
        return deltas

    def _learned_shift(self, config: Config) -> tuple[float, str]:
        """How much later than the corrected model a config ranks by the learnings (log units) and
        the learning that says so: a config with p=b, its p=a twin in the space, moves by the
        learning's shift (`_learning_deltas`; the largest where several apply)."""
        got = self._learned.get(config)
        if got is not None:
            return got
        shift, why = 0.0, ""
        rules = self._read_learnings() if self.estimate(config) is not None else []
        if rules and self._deltas is None:
            self._pool_of()  # the shifts are read off the pool's configs
        for lid, param, a, b, effect, low in rules:
            assert self._deltas is not None
            need = self._deltas[lid]
            if need > shift and self._twin(config, param, a, b) is not None:
                shift, why = need, (f"learning {lid}: {param}={a} beats {param}={b} "
                                    f"({effect:.2f}x on average, at least {low:.2f}x)")
        self._learned[config] = (shift, why)
        return shift, why

    # ---- history -------------------------------------------------------------------
    def _read_history(self) -> None:
        """The correction from the nearest problem of the store in this problem's regime (see the
        module docstring); none without history, without a tile model, or with no such problem."""
        if self._transfer_read:
            return
        self._transfer_read = True
        history, p = self.ctx.history, self.ctx.problem
        model = self._space_model
        if history is None or not (self._modelled or model):
            return
        kernel, device = self.ctx.kernel, self.ctx.device
        regime = element_wise_operands(p) if self._modelled else ()
        devices = [device, *(d for d in history.devices(kernel) if siblings(device, d))]

        def like(q: Problem) -> bool:  # modelled alike: a GEMM whose operands load the same way, or what
            if model is not None:  # the space's model says (`space_models`)
                return model.alike(p, q)
            return gemm_dims(q) is not None and element_wise_operands(q) == regime

        alike = [(q, d) for d in devices for q in history.measured_problems(kernel, d)
                 if like(q) and (q, d) != (p, device)]

        version = self.ctx.kernel_version
        other_version = {(q, on): bool(version) and version not in history.kernel_versions(kernel, on, q)
                          for q, on in alike}

        def rank(source: tuple[Problem, str]) -> tuple[float, bool, bool, str, str]:
            q, on = source  # nearest first; at equal distance this kernel version's, this device's, then by key
            return _source_distance(p, device, q, on, model), other_version[source], on != device, q.key(), on

        loads = ", ".join(regime) + " element by element" if regime else "vectorised operands"
        nearest = f"the nearest {model.problems} the store holds" if model is not None else (
            f"the nearest problem the store holds with {loads}")
        parts: list[str] = []
        for q, on in sorted(alike, key=rank):
            xs: list[tuple[float, ...]] = []
            ys: list[float] = []
            measured = history.measured(kernel, on, q)
            stride = math.ceil(len(measured) / TRANSFER_MAX_RESULTS) if measured else 1
            for config, ms in sorted(measured, key=lambda m: m[0].key())[::stride]:
                x = self._coords(config)
                if x is None or not ms > 0:
                    continue
                modelled = self._source_ms(q, config)
                if modelled is not None:
                    xs.append(x)
                    ys.append(math.log(ms) - math.log(modelled))
            if len(ys) < TRANSFER_MIN_RESULTS:
                continue
            middle = float(np.median(ys))
            s = self._gp_settings()
            gp = ResidualGp(GpSettings(lengthscales=s.lengthscales, signal_var=s.signal_var, offset_var=0.0,
                                       noise_var=TRANSFER_NOISE_VAR))
            gp.fit(xs, [y - middle for y in ys])
            self._transfers.append(gp)
            self._weights.append(_source_weight(_source_distance(p, device, q, on, model)))
            self._sources.append((q, len(ys), "" if on == device else on))
            where = "" if on == device else f" on the {on}"
            if q == p:
                part = f"its own {len(ys)} earlier results{where}"  # on a sibling device
            elif not parts:
                part = f"{len(ys)} results of {q.label()}{where}, {nearest}"
            else:
                part = f"{len(ys)} of {q.label()}{where}"
            if other_version[(q, on)]:
                part += f" (measured by another version of the kernel than {version})"
            parts.append(part)
            if (q == p and len(parts) == 1) or len(parts) == TRANSFER_SOURCES:
                break  # the problem's own earlier results (on a sibling), the nearest there can be, stand alone
        if parts:
            mean = "" if len(parts) == 1 else " (the mean of their corrections, weighed by 1/distance²)"
            rest = ", ".join(parts[1:-1]) + (" and " if len(parts) > 2 else "") + parts[-1] if len(parts) > 1 else ""
            self._notes.append(f"rules: the {self._model_name()} for {p.label()} corrected by {parts[0]}"
                               + (f", and by {rest}" if rest else "") + mean)

    def _source_ms(self, q: Problem, config: Config) -> float | None:
        """The model's time of a config on a problem of the store (None where it cannot launch)."""
        if self._space_model is not None:
            other = self._space_model.estimate(q, config)
            return other.predicted_ms if other.launches and math.isfinite(other.predicted_ms) else None
        tile = tile_of(config)
        if tile is None:
            return None
        est = estimate_tile(q, tile, self.device, self.constants)
        return est.predicted_ms if est.launches and math.isfinite(est.predicted_ms) else None

    def _source_label(self) -> str:
        """The problems the history's correction comes from, with the sibling device each ran on if any."""
        assert self._sources
        labels = [problem.label() + (f" on the {on}" if on else "") for problem, _, on in self._sources]
        return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]

    def _shift(self, config: Config) -> float:
        """The history's correction of the model's log-time for a config (0 without one)."""
        self._read_history()
        if not self._transfers:
            return 0.0
        shift = self._shifts.get(config)
        if shift is None:
            x = self._coords(config)
            shift = 0.0 if x is None else float(np.average([gp.predict([x])[0][0] for gp in self._transfers],
                                                           weights=self._weights))
            self._shifts[config] = shift
        return shift

    def _shift_all(self, configs: Sequence[Config], coords: np.ndarray) -> np.ndarray:
        """The correction of each config of the pool (their coordinates given), in chunks."""
        self._read_history()
        if not self._transfers or not len(configs):
            return np.zeros(len(configs))
        shifts = np.average([_predict(gp, coords)[0] for gp in self._transfers], axis=0, weights=self._weights)
        self._shifts.update(zip(configs, (float(v) for v in shifts), strict=True))
        return shifts

    def _rank_key(self, config: Config) -> float:
        """The log-prediction plus what the failures seen so far say about the config."""
        return self._log_model(config) + self._penalty(config)

    def _pool_of(self) -> _Pool:
        """Valid configs the resource model lets launch, in the model's order (ties: space order).

        The space is walked tile first: the configs of a tile the resource model says cannot
        launch are skipped unbuilt, and only the others are checked against the space's constraints."""
        if self._pool is None:
            space, problem = self.ctx.space, self.ctx.problem
            params = space.params
            tiled = [i for i, p in enumerate(params) if p.name in TILE_NAMES]
            rest = [i for i in range(len(params)) if i not in tiled]
            in_order = operator.itemgetter(*np.argsort(tiled + rest).tolist())  # tile + rest -> param order
            names = [p.name for p in params]
            radix = [math.prod(len(p.choices) for p in params[i + 1:]) for i in range(len(params))]
            rests = [(steps, tuple(params[i].choices[s] for i, s in zip(rest, steps, strict=True)),
                      sum(radix[i] * s for i, s in zip(rest, steps, strict=True)))
                     for steps in itertools.product(*(range(len(params[i].choices)) for i in rest))]
            found: list[tuple[float, int, Config, tuple[int, ...]]] = []
            skipped = 0
            for tile_steps in itertools.product(*(range(len(params[i].choices)) for i in tiled)):
                tile_values = tuple(params[i].choices[s] for i, s in zip(tiled, tile_steps, strict=True))
                tile = tile_from(dict(zip((names[i] for i in tiled), tile_values, strict=True)))
                est = self._estimate_tile(tile)
                if est is not None and not est.launches:  # whether it launches is the same for every variant
                    skipped += 1
                    continue
                keys_of: dict[bool, tuple[float, Estimate | None]] = {}  # by Tile.wraps_rows (the VARIANT's)
                base = sum(radix[i] * s for i, s in zip(tiled, tile_steps, strict=True))
                for rest_steps, rest_values, offset in rests:
                    config = Config.of(dict(zip(names, _tuple(in_order(tile_values + rest_values)), strict=True)))
                    if space.check(config, problem) is None:
                        wraps = tile is not None and config.get(VARIANT) not in ROWS_MASKED_VARIANTS
                        if wraps not in keys_of:
                            e = self._estimate_tile(tile and dataclasses.replace(tile, wraps_rows=wraps))
                            keys_of[wraps] = (0.0 if e is None else math.log(e.predicted_ms)), e
                        key, e = keys_of[wraps]
                        other = self.space_estimate(config) if e is None else None
                        if other is not None:  # the history's correction comes with _shift_all
                            key = math.log(other.predicted_ms) if other.launches else OUT_OF_RESOURCES_PENALTY
                        found.append((key + self._penalty_of(config, e), base + offset, config,
                                      _tuple(in_order(tile_steps + rest_steps))))
            if skipped:
                log.debug("rules: %d tiles of %s cannot launch by the resource model", skipped, problem.label())
            configs = [f[2] for f in found]
            steps = np.array([f[3] for f in found], dtype=np.int64).reshape(len(found), len(params))
            positions = _positions(steps, self._grades)
            keys = np.array([f[0] for f in found], dtype=float)
            keys = keys + self._shift_all(configs, positions / np.asarray(self._scales, dtype=float))
            if self._read_learnings():
                if self._deltas is None:
                    self._deltas = self._learning_deltas(configs)
                keys = keys + np.array([self._learned_shift(c)[0] for c in configs])
            order = np.lexsort((np.array([f[1] for f in found], dtype=np.int64), keys))  # ties: space order
            self._pool = _Pool.of([configs[i] for i in order], keys[order], steps[order], positions[order],
                                  self._scales)
        return self._pool

    def _configs(self) -> list[Config]:
        """Valid configs the resource model lets launch, in the model's order (ties: space order)."""
        return list(self._pool_of().configs)

    def _unseen(self, pool: _Pool, seen: set[Config]) -> np.ndarray:
        """Rows of the pool not in `seen`, in pool order."""
        mask = np.ones(len(pool.configs), dtype=bool)
        for c in seen:
            steps = self._steps(c)
            row = None if steps is None else pool.rows.get(steps)
            if row is not None and pool.configs[row] == c:
                mask[row] = False
        return np.flatnonzero(mask)

    def _unknown(self, pool: _Pool, alive: np.ndarray, seen: set[Config]) -> np.ndarray:
        """The `alive` rows that differ from every seen config in more than the inert parameters
        (`_inert`: one measured, the others are known); all of `alive` when none does, so the
        search still ends exhaustive."""
        live = ~np.isinf(np.asarray(self._scales))
        if live.all():
            return alive
        sizes = [len(p.choices) for p, on in zip(self.ctx.space.params, live, strict=True) if on]
        seen_steps = [steps for c in seen if (steps := self._steps(c)) is not None]
        if not seen_steps:
            return alive
        known = np.ravel_multi_index(np.asarray(seen_steps, dtype=np.int64)[:, live].T, sizes)
        keep = ~np.isin(np.ravel_multi_index(pool.steps[alive][:, live].T, sizes), known)
        return alive[keep] if keep.any() else alive

    def _training(self) -> tuple[list[tuple[float, ...]], list[float]]:
        xs: list[tuple[float, ...]] = []
        ys: list[float] = []
        for config, r in self._results.items():
            x = self._coords(config)
            if r.status is Status.OK and r.median_ms is not None and x is not None:
                xs.append(x)
                ys.append(math.log(r.median_ms) - self._log_model(config))
        return xs, ys

    def _believe_pending(self, gp: ResidualGp, xs: list[tuple[float, ...]], ys: list[float],
                         pending: set[Config]) -> None:
        """Configs in flight count as measured at their predicted mean, so new picks look elsewhere."""
        coords = [x for c in sorted(pending, key=Config.key) if (x := self._coords(c)) is not None]
        if coords:
            means, _ = gp.predict(coords)
            xs.extend(coords)
            ys.extend(float(m) for m in means)
            gp.fit(xs, ys)

    def _local_step(self, pool: _Pool, alive: np.ndarray, best: Result | None,
                    measured: int) -> np.ndarray | None:
        """Which of the `alive` rows are the incumbent's untried neighbours (a mask over `alive`),
        when this pick is a local step."""
        every = self.settings.neighbour_every
        if not every or self._picks % every or best is None or measured < self.settings.neighbour_after:
            return None
        at = self._steps(best.config)
        if at is None:
            return None
        moved = np.abs(pool.positions[alive] - _positions(np.asarray([at], dtype=np.int64), self._grades))
        near = (np.count_nonzero(moved, axis=1) == 1) & (moved.sum(axis=1) <= 1 + 1e-9)
        return near if near.any() else None

    def _untried(self, pool: _Pool, alive: np.ndarray,
                 pending: set[Config]) -> tuple[np.ndarray, dict[int, int]] | None:
        """Where every config measured (or in flight) shares one value of a tile parameter the GP
        reads and the pool holds others: a mask over `alive` of the configs with another value of
        such a parameter, and the shared values (parameter index -> step). None when there is none."""
        if not self.settings.test_untried:
            return None
        ran = [c for c, r in self._results.items() if r.status is Status.OK and r.median_ms is not None]
        steps = [x for c in (*ran, *pending) if (x := self._steps(c)) is not None]
        if not steps:
            return None
        shared: dict[int, int] = {}
        mask = np.zeros(len(alive), dtype=bool)
        for j, param in enumerate(self.ctx.space.params):
            values = {x[j] for x in steps}
            if param.name not in TILE_NAMES or np.isinf(self._scales[j]) or len(values) > 1:
                continue
            other = pool.steps[alive, j] != next(iter(values))
            if other.any():
                shared[j] = next(iter(values))
                mask |= other
        return (mask, shared) if shared else None

    def _untried_why(self, steps: np.ndarray, shared: dict[int, int]) -> str:
        params = self.ctx.space.params
        moved = [j for j, v in shared.items() if int(steps[j]) != v]
        new = ", ".join(f"{params[j].name}={params[j].choices[int(steps[j])]}" for j in moved)
        old = ", ".join(f"{params[j].name}={params[j].choices[shared[j]]}" for j in moved)
        return f"tests {new}: every config measured so far has {old}"

    def _neighbours(self, a: Config, b: Config) -> bool:
        """True when b differs from a in one parameter, by at most one step of its choices (a
        factor of two at most, for a parameter graded by powers of two: see `_grades`)."""
        xa, xb = self._steps(a), self._steps(b)
        if xa is None or xb is None:
            return False
        pa, pb = (_positions(np.asarray([x], dtype=np.int64), self._grades)[0] for x in (xa, xb))
        moved = [abs(float(i - j)) for i, j in zip(pa, pb, strict=True) if i != j]
        return len(moved) == 1 and moved[0] <= 1 + 1e-9

    def _steps(self, config: Config) -> tuple[int, ...] | None:
        """Each parameter's position among its choices; None outside the space."""
        return self._steps_of(config.as_dict())

    def _steps_of(self, values: dict[str, object]) -> tuple[int, ...] | None:
        out = []
        for name, positions in self._positions:
            v = values.get(name)
            pos = positions.get((type(v), v))
            if pos is None:
                return None
            out.append(pos)
        return tuple(out)

    def _pick(self, gp: ResidualGp, pool: _Pool, alive: np.ndarray,
              among: np.ndarray | None = None) -> tuple[int, float, float]:
        """The index in `alive` of the next pick (least lower confidence bound), its GP mean and std."""
        means, stds = _predict(gp, pool.coords[alive])
        score = pool.prior[alive] + means - self.settings.kappa * stds
        if among is not None:
            score = np.where(among, score, np.inf)
        i = int(np.argmin(score))  # first minimum: ties keep the prior order
        return i, float(means[i]), float(stds[i])

    def _coords(self, config: Config) -> tuple[float, ...] | None:
        """Each parameter's position among its choices (`_grades`), over its length scale; None
        outside the space."""
        steps = self._steps(config)
        if steps is None:
            return None
        return tuple(g[i] / scale for i, g, scale in zip(steps, self._grades, self._scales, strict=True))

    def _position(self, config: Config) -> tuple[float, ...]:
        x = self._coords(config)
        if x is None:
            raise ValueError(f"config {config.label()} lies outside the space")
        return x

    def _gp_settings(self) -> GpSettings:
        s = self.settings
        # where the model errs more (both operands loaded element by element, see _inert), its
        # prior is wider by the variance ratio measured where the constants were fitted
        wider = self.constants.scalar_error_var if np.isinf(self._scales).any() else 1.0
        return GpSettings(lengthscales=(1.0,) * len(self.ctx.space.params), signal_var=s.signal_var * wider,
                          offset_var=s.offset_var, noise_var=s.noise_var)

    # ---- failures ------------------------------------------------------------------
    def _learn_failure(self, r: Result) -> None:
        if not r.status.never_runs or r.status is Status.INVALID:
            return
        est = self.estimate(r.config)
        if est is None:
            return
        if r.status is Status.OUT_OF_RESOURCES:
            self._smem_cap = est.shared_bytes if self._smem_cap is None else min(self._smem_cap, est.shared_bytes)
        else:
            self._bad_shapes.add(_failure_key(r.config))
        self._pool = None  # re-rank

    def _penalty(self, config: Config) -> float:
        return self._penalty_of(config, self.estimate(config))

    def _penalty_of(self, config: Config, est: Estimate | None) -> float:
        if est is None:
            return 0.0
        if self._smem_cap is not None and est.shared_bytes >= self._smem_cap:
            return OUT_OF_RESOURCES_PENALTY
        return FAILED_SHAPE_PENALTY if self._bad_shapes and _failure_key(config) in self._bad_shapes else 0.0

    # ---- explaining ----------------------------------------------------------------
    def _why(self, config: Config, predicted: float, std: float, best: Result | None, measured: int) -> str:
        est, other = self.estimate(config), self.space_estimate(config)
        if other is not None:
            assert self._space_model is not None
            reason = self._space_model.describe(other, config) + self._device_note
        elif est is None:
            reason = "no tile model for this space"
        else:
            reason = describe(est, self.roofline, self.device) + self._device_note
        if self._sources and (est is not None or other is not None) and abs(shift := self._shift(config)) >= 0.01:
            reason += f"; model ×{math.exp(shift):.2f} by the results of {self._source_label()}"
        learned, by = self._learned_shift(config) if est is not None else (0.0, "")
        if learned >= 0.01:
            reason += f"; ranked ×{math.exp(learned):.2f} slower by {by}"
        if self._penalty(config):
            reason += "; ranked down: near a config that failed to run"
        if measured:
            prior = self.prior_ms(config)  # 1.0 without a model
            reason += f"; model ×{predicted / prior:.2f} after {measured} measured"
        lo, hi = predicted * math.exp(-2 * std), predicted * math.exp(2 * std)
        if est is None and other is None and not measured:
            return f"{reason}; no prediction yet, taken in space order"
        claim = f"hypothesis: {lo:.3g}-{hi:.3g} ms"
        if best is not None and best.median_ms is not None:
            claim += ", beats best" if hi < best.median_ms else f" vs best {best.median_ms:.3g} ms"
        return f"{reason}; predicted {predicted:.3g} ms; {claim}"

    def _absorb(self, state: SearchState) -> None:
        fresh = [r for c, r in state.results.items() if self._results.get(c) != r]
        if fresh:
            self.observe(fresh)


@dataclass(frozen=True)
class _Pool:
    """The configs the rules may propose, in prior order, with arrays over them for the picks."""

    configs: list[Config]
    prior: np.ndarray  # the rank key (log-prediction + failure penalty) of each config
    steps: np.ndarray  # [config, param]: index among the parameter's choices
    positions: np.ndarray  # [config, param]: the graded position of that choice (`_grades`)
    coords: np.ndarray  # positions over the length scales: the GP's coordinates
    rows: dict[tuple[int, ...], int]  # steps -> row

    @classmethod
    def of(cls, configs: list[Config], prior: np.ndarray, steps: np.ndarray, positions: np.ndarray,
           scales: tuple[float, ...]) -> _Pool:
        coords = positions / np.asarray(scales, dtype=float)
        rows = {tuple(int(v) for v in s): i for i, s in enumerate(steps)}
        return cls(configs, prior, steps, positions, coords, rows)


def _inert(problem: Problem, space: SearchSpace) -> frozenset[str]:
    """Parameters that cannot change a time on this problem: where both operands load element by
    element (K and N not multiples of 16, see `tile_model`), nothing goes through the asynchronous
    copy pipeline, so its depth (num_stages) does nothing. The GP then reads configs that differ only
    in them as one point: one measured, the others are known. Not where the space holds a way to
    vectorise the loads (matmul's ALIGN_HINT or its tensor-descriptor variants)."""
    if len(element_wise_operands(problem)) < 2:
        return frozenset()
    names = space.names
    if "ALIGN_HINT" in names and True in space.param("ALIGN_HINT").choices:
        return frozenset()
    if "VARIANT" in names and set(space.param("VARIANT").choices) - {"grouped", "splitk", "persistent"}:
        return frozenset()
    return frozenset(ALIASES["stages"])


def _grades(choices: tuple[object, ...]) -> tuple[float, ...]:
    """Where each choice of a parameter sits, for distances between configs: its index, except for
    sizes graded by powers of two with a few values between them (BLOCK_SIZE_N 16 ... 128, 160,
    192, 256): there a power of two sits at its index among the powers of two and a value between
    two of them at the lower one's plus log2 of the ratio (160: 3.32, 192: 3.58, 256: 4), so 128
    and 256 stay one step apart as in a space of powers of two alone. Graded so: consecutive
    powers of two and fewer other values, each between the smallest and the largest."""
    index = tuple(float(i) for i in range(len(choices)))
    if not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in choices):
        return index
    sizes = [int(c) for c in choices]  # type: ignore[call-overload]
    powers = sorted(c for c in sizes if c & (c - 1) == 0)
    others = [c for c in sizes if c not in powers]
    doubling = all(b == 2 * a for a, b in itertools.pairwise(powers))
    if not others or not doubling or len(others) >= len(powers) or any(not powers[0] < c < powers[-1]
                                                                        for c in others):
        return index  # powers of two alone, or a range of plain integers (1 ... 8)
    out = []
    for c in sizes:
        below = max(i for i, q in enumerate(powers) if q <= c)
        out.append(below + math.log2(c / powers[below]))
    return tuple(out)


def _positions(steps: np.ndarray, grades: list[tuple[float, ...]]) -> np.ndarray:
    """[config, param] choice indices -> graded positions."""
    return np.stack([np.asarray(g, dtype=float)[steps[:, j]] for j, g in enumerate(grades)], axis=1)


def _predict(gp: ResidualGp, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The GP's mean and std at every row of x, in chunks of PREDICT_ROWS rows."""
    if len(x) <= PREDICT_ROWS:
        return gp.predict(x)
    parts = [gp.predict(x[i:i + PREDICT_ROWS]) for i in range(0, len(x), PREDICT_ROWS)]
    return np.concatenate([m for m, _ in parts]), np.concatenate([s for _, s in parts])


def _shape_distance(a: Problem, b: Problem, model: SpaceModel | None = None) -> float:
    """Distance of two GEMM problems in log-shape space: log2 ratios of M, N and K, and 1 where the
    element sizes differ (warm start's `distance` counts a differing dtype instead: bf16 and fp16
    are one to the tile model); of two problems a space model reads, likewise over its `dims`
    (rows and cols; heads, S and D)."""
    ga, gb = gemm_dims(a), gemm_dims(b)
    if ga is not None and gb is not None:
        da, db = tuple(ga), tuple(gb)
    else:
        assert model is not None, "problems without a GEMM's dims need the space model's"
        da, db = model.dims(a), model.dims(b)
    d2 = sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(da[:-1], db[:-1], strict=True))
    return math.sqrt(d2 + (da[-1] != db[-1]))


def _source_distance(p: Problem, device: str, q: Problem, on: str, model: SpaceModel | None = None) -> float:
    """How far the results of `q` measured on `on` stand from `p` on `device`: their shape distance,
    and 1 more (in quadrature, as a differing element size) where the device is a sibling."""
    d = _shape_distance(p, q, model)
    return d if on == device else math.sqrt(d * d + 1.0)


def _source_weight(distance: float) -> float:
    """A source's weight in the history's correction: the inverse square of its distance, from
    TRANSFER_NEAR up (a source at distance 0.1 weighs 16, as one at 0.25, not 100)."""
    return 1.0 / max(distance, TRANSFER_NEAR) ** 2


def _failure_key(config: Config) -> tuple[tuple[str, object], ...]:
    """What a config that failed to run shares with those its failure ranks down: every parameter
    but num_stages (the tile shape, warps, and whatever lies outside the tile)."""
    return tuple((k, v) for k, v in config.items_ if k not in ALIASES["stages"])


def _tuple(x: object) -> tuple:  # type: ignore[type-arg]
    """itemgetter's answer as a tuple (it returns the bare item when given one index)."""
    return x if isinstance(x, tuple) else (x,)
