"""The planner panel's pure half: its config (presets, GPUs, batch, context, which ranked layout to show) and
the view it computes (the job, the best layouts, the chosen one's terms and memory). No widgets, no processes.

Each term of the stacked step names the chapter whose demo checked its formula on real ranks (CHECKED_IN: the
chapter numbers of breakdown.TERM_CHAPTERS), so the panel and the notebook can say where a number comes from.
The search is panel_search.panel_search: the planner's own breakdown and memory on a narrowed space (one layout
per mesh shape: b=1, the largest interleaving up to 4, ZeRO-1 and no recompute unless they do not fit), bounded
so a move is answered in tens of milliseconds; the CLI, `wmdist plan`, searches the planner's full space
(rank.rank_layouts) and may find a faster layout (SEARCH_RULE says this on the page).
`PlanCache` keeps each job's ranking, so a control moved back, or a state the panel's prefetcher computed
ahead, costs a dictionary look-up.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from wmdist.base.knobs import knob
from wmdist.costs.validate import require_choice, require_int
from wmdist.planner.breakdown import TERM_CHAPTERS, TERMS
from wmdist.planner.model import TrainingJob, from_architecture
from wmdist.planner.presets import PRESETS
from wmdist.planner.panel_search import MAX_VIRTUAL, panel_search
from wmdist.planner.rank import Plan
from wmdist.planner.scoring import EFFICIENCY, cluster_spec

# Where each term of the breakdown was checked against real ranks: the chapter and what it measured.
CHECKED_IN: dict[str, str] = {t: text.split(" (")[0].replace(" and ", ", ") for t, text in TERM_CHAPTERS.items()}
CHECKED_WHAT: dict[str, str] = {      # what each term computes, for the notebook's table beside its chapter
    "compute": "the 6N FLOPs per token and attention at one efficiency per GPU type",
    "elementwise": "the memory calculator's saved activations and the loss, moved through HBM a few times",
    "optimizer": "the Adam update of the weights a GPU holds after ZeRO's split",
    "bubble": "each other stage's fill and drain: (P-1)/(vM) of the busy time when stages are equal",
    "tp": "4 reduce-scatters and 4 all-gathers per layer with sequence parallelism",
    "cp": "ring attention's K, V passes, hidden behind the attention they feed",
    "ep": "the dispatch and combine all-to-alls, forward and backward",
    "pp": "one activation forward and one gradient back per microbatch and stage",
    "dp": "the gradient all-reduce or ZeRO's reduce-scatter and all-gather, mostly hidden",
}
PLACEMENT_CHAPTER = "09"            # which link tier each axis gets, from the mesh order
MEMORY_CHAPTER = "00"               # the calculator behind every memory bar

MODELS = ("llama3-405b", "gpt3-175b", "bloom-176b", "mcore-70b", "mcore-7.1b", "mixtral-8x22b")
GPUS = ("h100", "a100-80gb", "h800")
GPU_COUNTS = tuple(2 ** k for k in range(3, 17))                # 8 ... 65,536
MIB = 2 ** 20
BATCHES = tuple((f"{n}M tokens", n * MIB) for n in (1, 2, 4, 8, 16))
CONTEXTS = tuple((f"{s // 1024}K", s) for s in (2048, 4096, 8192, 32768, 131072))
TOP = 5
SEARCH_RULE = (f"The panel searches one layout per mesh shape (b=1, the largest interleaving up to {MAX_VIRTUAL}, "
               "ZeRO-1 and no recompute unless they do not fit, MoE's largest ep); `wmdist plan` searches every "
               "knob and may find a faster layout.")


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    """What the panel plans: a published model shape on a cluster of one GPU type, and which ranked layout to show."""
    model: str = knob("llama3-405b", "model", options=MODELS)
    gpu: str = knob("h100", "GPU", options=GPUS)
    gpus: int = knob(16384, "GPUs", options=GPU_COUNTS)
    batch_tokens: int = knob(16 * MIB, "batch per step", options=BATCHES)
    seq_len: int = knob(8192, "context", options=CONTEXTS)
    pick: int = knob(1, "show layout #", options=tuple(range(1, TOP + 1)))

    def __post_init__(self) -> None:
        require_choice("model", self.model, tuple(PRESETS))
        require_choice("gpu", self.gpu, tuple(EFFICIENCY))
        require_int("gpus", self.gpus, 1)
        require_int("seq_len", self.seq_len, 1)
        require_int("batch_tokens", self.batch_tokens, 1)
        require_int("pick", self.pick, 1, high=TOP)
        if self.batch_tokens % self.seq_len:
            raise ValueError(f"batch_tokens={self.batch_tokens} must be a whole number of sequences of "
                             f"seq_len={self.seq_len}")


@dataclass(frozen=True, kw_only=True)
class PlannerView:
    """The job, its best layouts (fastest first, at most TOP) and the one on show (None when nothing fits)."""
    config: PlannerConfig
    job: TrainingJob
    plans: tuple[Plan, ...]

    @property
    def chosen(self) -> Plan | None:
        """The layout the config's `pick` selects, or the last one found if fewer fit."""
        return self.plans[min(self.config.pick, len(self.plans)) - 1] if self.plans else None


def job_of(config: PlannerConfig) -> TrainingJob:
    """The planner's job for the config: the preset's shape on the GPU type at its one stated efficiency
    (scoring.EFFICIENCY, fitted once to the published runs), FlashAttention on (as in a run planned today)."""
    cluster = cluster_spec(config.gpu, efficiency=EFFICIENCY[config.gpu])
    return TrainingJob(model=from_architecture(PRESETS[config.model]), cluster=cluster, gpus=config.gpus,
                       seq_len=config.seq_len, batch_tokens=config.batch_tokens, flash_attention=True)


class PlanCache:
    """Each job's ranked plans, computed once (the job is frozen, so it is its own key); safe to share between
    the kernel's thread and the panel's prefetcher."""

    def __init__(self) -> None:
        self._plans: dict[TrainingJob, tuple[Plan, ...]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._plans)

    def plans(self, job: TrainingJob) -> tuple[Plan, ...]:
        with self._lock:
            found = self._plans.get(job)
        if found is None:
            found = panel_search(job, top=TOP).plans
            with self._lock:
                self._plans[job] = found
        return found


def planner_view(config: PlannerConfig, *, cache: PlanCache | None = None) -> PlannerView:
    """The panel's model: the job and its TOP fastest fitting layouts (panel_search.panel_search's space)."""
    job = job_of(config)
    plans = cache.plans(job) if cache is not None else panel_search(job, top=TOP).plans
    return PlannerView(config=config, job=job, plans=plans)


def term_seconds(plan: Plan) -> dict[str, float]:
    """The chosen layout's stacked terms in TERMS order (seconds per step)."""
    return {t: plan.step.terms[t] for t in TERMS}
