"""The Speculative Streaming decode loop (docs/design.md#decode-step), and plain autoregressive decoding
through the same code path (``mode="ar"``) as its reference.

Each step: build the draft tree under the root from the last accepted node's streams, run it
(tree attention, pruning, streams), verify, commit the accepted path's K/V in every layer, and
take the next root and the next draft from the last accepted node. The forward passes go through
a :class:`~mlx_specstream.runner.Runner`: an MLX model, or an exported Core ML package
(``coreml_driver.PackageRunner``); everything else exists once, here.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import accumulate

import mlx.core as mx
import numpy as np

from .constraint import TokenConstraint, constrained_argmax, constrained_logits, node_states
from .device import on_gpu
from .errors import ContextLengthError, OptionError, check_kind, check_seed, check_switch, prompt_too_long
from .logprobs import TokenLogprob, token_logprobs
from .lookup import LookupScore, lookup_match, match_prior
from .runner import MLXRunner, PassRequest, Runner
from .streams import check_prune_threshold
from .tree import Tree, best_rate, build_tree, check_tree_sizes, pass_cost
from .verify import probabilities, sample, verify_greedy, verify_sampling


@dataclass
class DecodeOptions:
    """The options of one generation: the keywords of :func:`~mlx_specstream.api.stream_generate`,
    with their defaults (None: the adapter's own, or this machine's)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # sampling: the k most likely tokens only (0: all)
    min_p: float = 0.0  # sampling: tokens at least min_p times as likely as the most likely one
    seed: int | None = None  # sampling; None: a fresh seed each generation, from MLX's generator
    mode: str = "ss"  # "ss" | "ar" | "lookup" (prompt-lookup drafts, a model-free baseline)
    # ss: prompt-lookup candidates merged into the streams' draft tree (hybrid drafts); None: on
    lookup: bool | None = None
    # ss and lookup: the adapter's n-gram drafts (ngrams.py) lead the lookup chain where the
    # adapter has them; None: on with lookup
    ngrams: bool | None = None
    gamma: int | None = None  # streams used for drafting (<= the adapter's)
    branch: int | None = None  # k: candidates per stream
    tree_budget: int | None = None  # max nodes per tree (root included)
    prune_threshold: float | None = None
    eos_token_ids: frozenset[int] = frozenset()
    # "tree": streams on every tree node in the same pass (the papers); "deferred" (lossless
    # only): streams of just the last accepted node, in a small pass after verification;
    # "auto": deferred where extra rows cost compute (CPU), tree on a GPU (device.on_gpu).
    streams: str = "auto"
    # Cost of one more tree node relative to a one-node pass; > 0 sizes each tree to the most
    # expected tokens per unit of cost (tree.best_size). None: the default for this machine.
    node_cost: float | None = None
    # Tokens the output may contain (e.g. sql_names.SQLNames): decoding is the constrained
    # model's, exactly (docs/design.md#constrained-decoding).
    constraint: TokenConstraint | None = None
    # Each emitted token's log-probability under the model, with the ``logprobs`` most likely
    # tokens' (0: the token's alone; None: none), as OpenAI's API returns them (logprobs.py)
    logprobs: int | None = None


# Measured on a 2-core x86 CPU with small products as sgemv (docs/engine.md#cost-of-a-pass-measured):
# with deferred streams, greedy decoding with the chain-alone rule is fastest at 0.05-0.07 on 20 sql
# prompts and level with 0.15 on 100 (interleaved runs, 2026-11-26); with streams on every node
# each extra node of a small tree costs 22-27% of a one-node pass. On Metal extra rows are nearly
# free: the whole budget runs.
CPU_NODE_COST = {"deferred": 0.07, "tree": 0.22}
# A deferred stream pass costs 0.8-1.3 one-node passes there (the same page).
CPU_STREAM_PASS_COST = 1.0


def default_node_costs() -> dict[str, float]:
    """The node cost used when none is given, by streams policy, on this machine."""
    return {k: 0.0 if on_gpu() else v for k, v in CPU_NODE_COST.items()}


@dataclass
class Stats:
    """What one generation did: tokens, forward passes, their trees, time and acceptance
    (:meth:`as_dict`: the fields results files and the server report)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    calls: int = 0  # forward passes after prefill
    prefill_time: float = 0.0
    decode_time: float = 0.0
    model_time: float = 0.0  # decode time spent inside the forward passes
    tree_nodes: int = 0  # summed over calls, before pruning
    kept_nodes: int = 0  # summed over calls, after pruning
    accepted_lengths: Counter = field(default_factory=Counter)
    stream_passes: int = 0  # deferred stream passes run (drafts of the steps that used streams)
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length"
    context_limit: int | None = None  # set when generation stopped at the model's context

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens advanced per decode forward pass (1.0 for autoregressive decoding), as verification
        accepted them: tokens a pass accepted past a stop string still count (``generated_tokens``
        counts only those through the one that completes it)."""
        n = sum(self.accepted_lengths.values())
        return sum(k * c for k, c in self.accepted_lengths.items()) / n if n else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_time if self.decode_time else 0.0

    @property
    def bookkeeping_share(self) -> float:
        """Share of decode time spent outside the model's forward passes."""
        return 1.0 - self.model_time / self.decode_time if self.decode_time else 0.0

    def snapshot(self) -> Stats:
        """A copy that later passes leave as it is (what one streamed step reports)."""
        return replace(self, accepted_lengths=Counter(self.accepted_lengths))

    def count_pass(self, tree_nodes: int, kept_nodes: int, path_length: int) -> None:
        """One forward pass after prefill: its tree, the nodes pruning kept, the accepted path's
        length (root included)."""
        self.calls += 1
        self.tree_nodes += tree_nodes
        self.kept_nodes += kept_nodes
        self.accepted_lengths[path_length] += 1

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "calls": self.calls,
            "mean_accepted_tokens": round(self.mean_accepted_tokens, 4),
            "accepted_length_histogram": dict(sorted(self.accepted_lengths.items())),
            "prefill_time_s": round(self.prefill_time, 6),
            "decode_time_s": round(self.decode_time, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "bookkeeping_share": round(self.bookkeeping_share, 4),
            "mean_tree_nodes": round(self.tree_nodes / self.calls, 3) if self.calls else 0.0,
            "mean_kept_nodes": round(self.kept_nodes / self.calls, 3) if self.calls else 0.0,
            "stream_passes": self.stream_passes,
            "finish_reason": self.finish_reason,
            "context_limit": self.context_limit,
        }


@dataclass
class Step:
    """What one forward pass produced."""

    tokens: list[int]  # emitted tokens (accepted drafts, then the next root)
    accepted: list[int]  # draft tokens accepted this pass
    rejected: list[int]  # the best draft continuation that was not accepted
    finished: str | None = None  # "stop" (EOS) or "length"
    logprobs: list[TokenLogprob] | None = None  # one per token, where the options ask for them


@dataclass
class _Rate:
    """A running estimate of tokens per unit of cost (exponentially weighted, from a prior)."""

    tokens: float
    cost: float
    weight: float = 0.2

    @property
    def value(self) -> float:
        return self.tokens / self.cost

    def update(self, tokens: float, cost: float) -> None:
        self.tokens += self.weight * (tokens - self.tokens)
        self.cost += self.weight * (cost - self.cost)


@dataclass
class _Draft:
    levels: list[list[int]]  # unique candidate tokens per level
    scores: list[list[float]]  # their log-probabilities
    draws: list[list[int]]  # sampling: the i.i.d. draws per level, in order
    q: list[np.ndarray]  # sampling: the stream distributions
    # Deterministic continuation: the adapter's n-gram drafts (the first ``from_ngrams``), then
    # prompt lookup's after them
    chain: list[int] = field(default_factory=list)
    chain_scores: list[float] = field(default_factory=list)  # their log-probabilities
    from_ngrams: int = 0


# Options a mode ignores (None: not given); the command line refuses them (check_used)
_UNUSED_IN = {"ss": (), "lookup": ("gamma", "branch", "prune_threshold"),
              "ar": ("gamma", "branch", "tree_budget", "prune_threshold", "node_cost", "lookup", "ngrams")}


def check_used(opts: DecodeOptions) -> None:
    """Refuse options that ``opts.mode`` ignores (``--mode ar --gamma 2``), and sampling cuts or a
    seed under greedy decoding (``--top-k 5`` at ``--temp 0``), for callers that want it said; the
    Python API and the server ignore them, so one set of options serves every mode."""
    cuts = [f"{{{name}}}" for name, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0))
            if getattr(opts, name) != off]
    if opts.temperature == 0 and cuts:
        verb = "cuts" if len(cuts) == 1 else "cut"
        raise OptionError(f"{', '.join(cuts)} {verb} what sampling draws from, and {{temperature=0}} "
                          "decodes greedily: give {temperature} > 0 to sample")
    if opts.temperature == 0 and opts.seed is not None:
        raise OptionError("{seed} seeds sampling, and {temperature=0} decodes greedily: give {temperature} "
                          "> 0 to sample")
    given = {name: getattr(opts, name) for name in _UNUSED_IN.get(opts.mode, ())}
    idle = [f"{{{name}=False}}" if value is False else f"{{{name}}}"  # --no-lookup said as typed
            for name, value in given.items() if value is not None]
    if opts.mode == "lookup" and opts.lookup is False:
        idle.append("{lookup=False}")
    if opts.streams != "auto" and opts.mode != "ss":
        idle.append("{streams}")
    if idle:
        raise OptionError(f"{{mode={opts.mode}}} does not use {', '.join(idle)}: drop "
                          + ("it" if len(idle) == 1 else "them"))


# Numeric options: whether each is a whole number, and whether None (the default) is allowed
_TYPED_OPTIONS = {"max_tokens": (True, False), "temperature": (False, False), "top_p": (False, False),
                  "top_k": (True, False), "min_p": (False, False), "logprobs": (True, True),
                  "gamma": (True, True), "branch": (True, True), "tree_budget": (True, True),
                  "node_cost": (False, True), "prune_threshold": (False, True)}


def check_prompt_ids(prompt: list[int], vocab: int | None) -> None:
    """Every id of ``prompt`` in the vocabulary ``0..vocab - 1`` (None: unknown, ids >= 0)."""
    bad = [t for t in prompt if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        raise ValueError(f"the prompt holds token id {bad[0]}, outside the model's vocabulary"
                         + (f" (0..{vocab - 1})" if vocab is not None else ""))


class Decoder:
    """Runs one generation; iterate :meth:`steps` to get tokens pass by pass. ``model``: an MLX
    model, or a :class:`~mlx_specstream.runner.Runner` (e.g. a Core ML package's). ``batched``:
    :meth:`steps` also yields a :class:`~mlx_specstream.runner.PassRequest` before each tree pass
    and each deferred stream pass, and goes on once the caller has run it (with other
    generations' passes: the server)."""

    def __init__(self, model, prompt: list[int], opts: DecodeOptions, batched: bool = False):
        if not prompt:
            raise ValueError("the prompt is empty")
        if opts.mode not in ("ss", "ar", "lookup"):
            raise OptionError(f"{{mode}} must be ss, ar or lookup, not {opts.mode!r}")
        for name, (whole, optional) in _TYPED_OPTIONS.items():
            if not (optional and getattr(opts, name) is None):
                check_kind(name, getattr(opts, name), whole)
        if opts.max_tokens < 1 and opts.max_tokens != -1:
            raise OptionError(f"{{max_tokens}} must be >= 1 (or -1: until EOS or the end of the context), "
                              f"not {opts.max_tokens}")
        if not 0 <= opts.temperature < math.inf:  # NaN fails too
            raise OptionError(f"{{temperature}} must be a finite number >= 0, not {opts.temperature}")
        check_seed(opts.seed, optional=True)  # None: a fresh one
        check_switch("lookup", opts.lookup, optional=True)
        check_switch("ngrams", opts.ngrams, optional=True)
        if opts.constraint is not None and not isinstance(opts.constraint, TokenConstraint):
            raise OptionError("{constraint} must be a TokenConstraint, not "
                              f"{type(opts.constraint).__name__}")
        if not 0 < opts.top_p <= 1:
            raise OptionError(f"{{top_p}} must be in (0, 1], not {opts.top_p}")
        if opts.top_k < 0:
            raise OptionError(f"{{top_k}} must be >= 0 (0: off), not {opts.top_k}")
        if not 0 <= opts.min_p <= 1:
            raise OptionError(f"{{min_p}} must be in [0, 1], not {opts.min_p}")
        if opts.logprobs is not None and opts.logprobs < 0:
            raise OptionError(f"{{logprobs}} must be >= 0 (the most likely tokens given beside each "
                              f"token), not {opts.logprobs}")
        self.runner = runner = model if isinstance(model, Runner) else MLXRunner(model)
        runner.check(opts.temperature, opts.branch, opts.tree_budget, opts.prune_threshold)
        self.limit = runner.limit
        vocab = runner.vocab_size
        check_prompt_ids(prompt, vocab)
        if self.limit is not None and len(prompt) >= self.limit:
            raise ContextLengthError(prompt_too_long(len(prompt), self.limit, runner.limit_source))
        if opts.max_tokens == -1:  # no limit of its own, as mlx-lm's -1
            opts = replace(opts, max_tokens=sys.maxsize)
        self.prompt, self.opts, self.batched = list(prompt), opts, batched
        cfg = runner.adapter_config
        if opts.mode == "ss" and cfg is None:
            raise OptionError("speculative decoding needs an adapter with streams: load one "
                              "({adapter}), or use {mode=ar} (plain decoding) or {mode=lookup} "
                              "(prompt-lookup drafts, no adapter needed)")
        if opts.mode == "ss" and cfg.gamma == 0:
            which = f"adapter '{cfg.name}'" if cfg.name else "the adapter"  # said as it is (braces too)
            raise OptionError(f" has no streams (mode {cfg.mode}): use {{mode=ar}} or {{mode=lookup}}, or an "
                              "adapter with streams", subject=which)
        self.shared = cfg is not None and cfg.mode == "shared"
        self.gamma = 0
        most = cfg.gamma if cfg is not None and cfg.gamma else None  # the adapter's streams
        if opts.mode != "ss" and not self.shared and opts.gamma is not None and (
                opts.gamma < 1 or (most is not None and opts.gamma > most)):  # unused, but no mode takes it
            raise OptionError(f"{{gamma}} must be in 1..{most} (the adapter's streams), not {opts.gamma}"
                              if most else f"{{gamma}} must be >= 1, not {opts.gamma}")
        if opts.mode == "ss" or self.shared:
            self.gamma = cfg.gamma if opts.gamma is None else opts.gamma
            if not 1 <= self.gamma <= cfg.gamma:
                raise OptionError(f"{{gamma}} must be in 1..{cfg.gamma} (the adapter's streams), "
                                  f"not {self.gamma}")
            if self.shared and self.gamma != cfg.gamma:
                raise OptionError(f"a shared-mode adapter runs with all its {cfg.gamma} streams: "
                                  "drop {gamma}")
        self.branch = opts.branch if opts.branch is not None else (cfg.branch if cfg else 1)
        default_budget = 11 if opts.mode == "lookup" else (cfg.tree_budget if cfg else 1)
        if runner.tree_size is not None:
            default_budget = min(default_budget, runner.tree_size)
        self.budget = opts.tree_budget if opts.tree_budget is not None else default_budget
        self.threshold = opts.prune_threshold if opts.prune_threshold is not None else (
            cfg.prune_threshold if cfg else 0.0)
        if vocab is not None and opts.logprobs is not None and opts.logprobs > vocab:
            raise OptionError(f"{{logprobs}} must be at most the vocabulary's {vocab}, not {opts.logprobs}")
        if vocab is not None and self.branch > vocab:
            raise OptionError(f"{{branch}} must be at most the vocabulary's {vocab}, not {self.branch}")
        check_tree_sizes(branch=self.branch, tree_budget=self.budget)
        check_prune_threshold(self.threshold)
        if opts.streams not in ("auto", "tree", "deferred"):
            raise OptionError("{streams} must be auto, tree or deferred")
        costs = runner.node_costs if runner.node_costs is not None else default_node_costs()
        if opts.streams not in ("auto", *costs):
            raise OptionError(f"{{streams}} must be auto or {' or '.join(costs)} here, not '{opts.streams}'")
        if opts.mode == "ss" and self.shared and opts.streams == "deferred":
            raise OptionError("{streams=deferred} is for lossless adapters: a shared-mode adapter's "
                              "streams run in the tree pass")
        self.deferred = opts.mode == "ss" and not self.shared and "deferred" in costs and (
            opts.streams == "deferred" or (opts.streams == "auto" and not on_gpu()))
        if opts.node_cost is not None and not 0 <= opts.node_cost < math.inf:
            raise OptionError(f"{{node_cost}} must be a finite number >= 0, not {opts.node_cost}")
        self.node_cost = opts.node_cost
        if self.node_cost is None:
            policy = "deferred" if self.deferred else "tree"
            self.node_cost = costs[policy] if opts.mode == "ss" else 0.0
        self.lookup = opts.mode == "lookup" or (opts.mode == "ss" and opts.lookup is not False)
        if opts.mode == "ss" and opts.ngrams and not self.lookup:
            raise OptionError("{ngrams} drafts lead the prompt-lookup chain: drop {lookup=False}")
        self.lookup_score, self.ngram_score = LookupScore(), LookupScore()
        self.ngrams = runner.ngrams if self.lookup and opts.ngrams is not False else None
        if opts.ngrams and self.lookup and self.ngrams is None:  # asked for, not merely on by default
            raise OptionError("{ngrams=True}: there are no n-gram drafts here (the adapter's ngrams.npz): "
                              "write them with specstream-mlx ngrams --adapter NAME --data DIR")
        # Deferred streams cost a pass of their own: tokens per unit of cost of the steps drafted
        # with them, against which a prompt-lookup chain alone is weighed (_draft). Prior: two
        # tokens a pass from a three-node tree.
        self.stream_pass_cost = CPU_STREAM_PASS_COST if self.deferred else 0.0
        self.stream_rate = _Rate(2.0, pass_cost(3, self.node_cost) + self.stream_pass_cost)
        # no seed: one drawn from MLX's generator, which mx.random.seed makes repeatable (as mlx-lm's
        # sampling is) and which starts from the clock in each process
        drawn = opts.seed is None and opts.temperature > 0
        seed = int(mx.random.randint(0, 2**31 - 1, ()).item()) if drawn else opts.seed
        self.rng = np.random.default_rng(seed)
        self.stats = Stats(prompt_tokens=len(prompt))
        self.constraint_state = opts.constraint.start if opts.constraint is not None else None

    # -- pieces of a step ---------------------------------------------------------------------
    def _target(self, tree: Tree | None = None) -> np.ndarray:
        """Greedy: argmax per surviving node of the last pass (``tree``; None: the prefill).
        Sampling: the sampling distribution per node. With a constraint, over the tokens it
        allows after each node's path."""
        c, runner = self.opts.constraint, self.runner
        states = None if c is None else node_states(c, self.constraint_state, tree)
        if self.opts.temperature == 0:
            top = runner.main_tokens()
            return top if c is None else constrained_argmax(c, states, top, runner.main_logits)
        logits = runner.main_logits()
        if c is not None:
            logits = constrained_logits(c, states, logits)
        return self._probabilities(logits)

    def _probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The sampling distribution of ``logits`` (..., V) under this generation's options."""
        o = self.opts
        return probabilities(logits, o.temperature, o.top_p, o.top_k, o.min_p)

    def _advance_constraint(self, tokens: list[int]) -> None:
        if self.opts.constraint is not None:
            self.constraint_state = self.opts.constraint.walk(self.constraint_state, tokens)

    def _draft(self, node: int) -> Iterator[PassRequest]:
        """Candidates for each level from the streams of ``node`` (surviving node of the last
        pass), and the prompt-lookup chain after the history; returns the :class:`_Draft`.

        Where the streams need a pass of their own (deferred), a chain whose expected tokens per
        unit of cost (``tree.best_rate``) are at least those of the steps drafted with streams so
        far (``stream_rate``, the stream pass counted) is the whole draft: the stream pass is
        skipped."""
        chain, scores, k = self._chain()
        draft = _Draft([], [], [], [])
        if self.opts.mode == "ss" and self.budget > 1 and not self._chain_alone_pays(scores):
            draft = yield from self._stream_draft(node)
        draft.chain, draft.chain_scores, draft.from_ngrams = chain, scores, k
        return draft

    def _chain(self) -> tuple[list[int], list[float], int]:
        """The deterministic chain after the history (up to ``budget - 1`` tokens), its
        log-probabilities and how many of its tokens lead it from the adapter's n-grams: those
        drafts, then prompt lookup's continuation of them."""
        room, chain, scores = self.budget - 1, [], []
        if self.ngrams is not None:
            chain, shares = self.ngrams.walk(self.history, room)
            scores = [self.ngram_score.logp(p) for p in shares]
        k = len(chain)
        if self.lookup and len(chain) < room:
            more, n = lookup_match(self.history + chain, num_draft=room - len(chain))
            chain, scores = chain + more, scores + [self.lookup_score.logp(match_prior(n))] * len(more)
        return chain, scores, k

    def _chain_alone_pays(self, chain_scores: list[float]) -> bool:
        """Whether a lookup chain with these log-probabilities, as the whole draft, advances at
        least as many tokens per unit of cost as the steps drafted with (deferred) streams."""
        if not chain_scores or not self.deferred:
            return False
        return best_rate([0.0, *accumulate(chain_scores)], self.node_cost) >= self.stream_rate.value

    def _stream_draft(self, node: int) -> Iterator[PassRequest]:
        """Greedy: each stream's top-k. Sampling: k i.i.d. draws per stream, each token once.
        Deferred streams of a batched decoder: their pass is handed to the caller first."""
        k, greedy = self.branch, self.opts.temperature == 0
        t = time.perf_counter()
        if self.batched and self.deferred:
            yield PassRequest(self.runner, None, node=node)
        streams = self.runner.stream_topk(node, k) if greedy else self.runner.stream_logits(node)
        if self.deferred:  # a stream pass ran
            self.stats.model_time += time.perf_counter() - t
            self.stats.stream_passes += 1
        if greedy:
            top, vals = streams
            return _Draft(top.tolist(), vals.tolist(), [], [])
        q = self._probabilities(streams)
        levels, scores, draws = [], [], []
        for j in range(self.gamma):
            d = [sample(q[j], self.rng) for _ in range(k)]
            uniq = list(dict.fromkeys(d))
            levels.append(uniq)
            scores.append([float(np.log(q[j][t])) for t in uniq])
            draws.append(d)
        return _Draft(levels, scores, draws, list(q))

    # -- the loop -------------------------------------------------------------------------
    def _pass(self, tree: Tree, prune_threshold: float) -> Iterator[PassRequest]:
        """Run one tree pass (or hand it to the caller when batched); returns the kept tree."""
        if not self.batched:
            return self.runner.step(tree, prune_threshold)
        request = PassRequest(self.runner, tree, prune_threshold)
        yield request
        return request.kept

    def steps(self) -> Iterator[Step | PassRequest]:
        opts, stats, runner = self.opts, self.stats, self.runner
        t0 = time.perf_counter()
        runner.start(self.prompt, self.gamma, self.deferred)
        target = self._target()
        root = int(target[0]) if opts.temperature == 0 else sample(target[0], self.rng)
        self._advance_constraint([root])
        self.history = self.prompt + [root]
        step = self._emit([root], [], [], 0, self._logits([0]))
        if step.finished is None:  # no drafts for a generation that is over
            draft = yield from self._draft(0)
        stats.prefill_time = time.perf_counter() - t0
        stats.model_time = 0.0
        emitted = len(step.tokens)
        yield step
        if (opts.mode == "ar" and opts.temperature == 0 and self.gamma == 0 and step.finished is None
                and isinstance(runner, MLXRunner) and not self.batched):
            yield from self._greedy_ar_steps(root, emitted)
            return
        while step.finished is None:
            t_step = time.perf_counter()
            depth = runner.max_depth  # the deepest path the runner can commit, inside the context
            if self.limit is not None:
                room = self.limit - 1 - runner.n
                depth = room if depth is None else min(depth, room)
            tree = build_tree(root, draft.levels[:depth], draft.scores[:depth], self.budget,
                              self.node_cost, draft.chain[:depth], draft.chain_scores[:depth])
            t_model = time.perf_counter()
            kept = yield from self._pass(tree, self.threshold if opts.mode == "ss" else 0.0)
            target = self._target(kept)
            stats.model_time += time.perf_counter() - t_model
            if opts.temperature == 0:
                path, root = verify_greedy(kept, target)
            else:
                path, root = verify_sampling(kept, target, draft.draws, draft.q, self.rng, draft.chain)
            if draft.levels and self.deferred:
                cost = pass_cost(len(tree), self.node_cost) + self.stream_pass_cost
                self.stream_rate.update(len(path), cost)
            accepted = kept.tokens[path[1:]].tolist()
            if draft.chain:
                self._learn_lookup(draft, kept, accepted)
            rejected = kept.best_below(path[-1])
            runner.commit(path)
            self._advance_constraint(accepted + [root])
            self.history += accepted + [root]
            step = self._emit(accepted + [root], accepted, rejected, emitted, self._logits(path))
            # the tokens the pass advanced the output by (EOS included, none past it or the limit)
            stats.count_pass(len(tree), len(kept), len(step.tokens) + (step.finished == "stop"))
            if step.finished is None:
                draft = yield from self._draft(path[-1])
            emitted += len(step.tokens)
            stats.decode_time += time.perf_counter() - t_step
            yield step

    def _learn_lookup(self, draft: _Draft, tree: Tree, accepted: list[int]) -> None:
        """Count the chain tokens this pass verified (its nodes in the tree) and the ones it
        accepted, for each source: the n-gram part, then the lookup part where the pass reached it."""
        chain, k = draft.chain, draft.from_ngrams
        v, proposed = 0, 0
        for t in chain:
            v = tree.child(v, t)
            if v is None:
                break
            proposed += 1
        hits = next((i for i, (a, c) in enumerate(zip(accepted, chain)) if a != c), min(len(accepted),
                                                                                      len(chain)))
        hits = min(hits, proposed)
        if k:
            self.ngram_score.update(min(proposed, k), min(hits, k))
        if proposed > k and hits >= k:
            self.lookup_score.update(proposed - k, hits - k)

    def _greedy_ar_steps(self, root: int, emitted: int) -> Iterator[Step]:
        """Plain greedy decoding, pipelined as in mlx-lm's ``generate_step``: each pass is queued
        on the device, fed the previous pass's argmax there, before the host reads that token,
        so building the graph and the bookkeeping overlap the model's compute. The passes, the
        tokens and the cache are those of the loop in :meth:`steps`; a pass queued behind an EOS
        is dropped from the cache.

        Under a constraint the queued pass is optimistic: when the host finds the argmax
        forbidden, that pass is dropped, the best allowed token of the same logits taken (as
        ``constrained_argmax`` does in the loop) and the pass queued again with it. The runner
        queues and drops the passes (``MLXRunner.queue_greedy``, ``drop_queued``)."""
        stats, runner, c = self.stats, self.runner, self.opts.constraint
        total = self.opts.max_tokens
        if self.limit is not None:
            total = min(total, self.limit - len(self.prompt))

        t = time.perf_counter()
        pending = runner.queue_greedy(mx.array([root], mx.int32))
        stats.model_time += time.perf_counter() - t
        stats.decode_time += time.perf_counter() - t  # decoding too: bookkeeping is their difference
        while True:
            t_step = time.perf_counter()
            last = emitted + 1 >= total  # this token is the last: nothing to queue behind it
            queued = None if last else runner.queue_greedy(pending[0])
            root = pending[0].item()
            if c is not None and c.advance(self.constraint_state, root) is None:
                if queued is not None:
                    runner.drop_queued()
                root = c.best(self.constraint_state, np.array(pending[1][0], np.float32))
                queued = None if last else runner.queue_greedy(mx.array([root], mx.int32))
            self._advance_constraint([root])
            stats.model_time += time.perf_counter() - t_step
            stats.count_pass(1, 1, 1)
            self.history.append(root)
            logits = None if self.opts.logprobs is None else np.array(pending[1].astype(mx.float32))
            step = self._emit([root], [], [], emitted, logits)
            emitted += len(step.tokens)
            if step.finished is not None and queued is not None:
                runner.drop_queued()
            stats.decode_time += time.perf_counter() - t_step
            yield step
            if step.finished is not None:
                return
            pending = queued

    def _logits(self, rows: list[int]) -> np.ndarray | None:
        """The last pass's main logits at its nodes ``rows`` (those that predicted the emitted
        tokens), where the options ask for log-probabilities."""
        return None if self.opts.logprobs is None else self.runner.main_logits()[rows]

    def _emit(self, tokens: list[int], accepted: list[int], rejected: list[int],
              emitted: int, logits: np.ndarray | None = None) -> Step:
        """Cut ``tokens`` at EOS or the token limit, whichever comes first (as plain decoding, one
        token a pass, would meet them), and update the statistics. ``logits`` (one row per token):
        their log-probabilities (logprobs.py)."""
        room = self.opts.max_tokens - emitted
        context_room = None if self.limit is None else self.limit - len(self.prompt) - emitted
        by_context = context_room is not None and context_room < room
        room = max(context_room if by_context else room, 0)
        eos = next((i for i, t in enumerate(tokens) if t in self.opts.eos_token_ids), None)
        finished = None
        if eos is not None and eos < room:
            tokens, finished = tokens[:eos], "stop"
        elif len(tokens) >= room:
            tokens, finished = tokens[:room], "length"
            if by_context:
                self.stats.context_limit = self.limit
        self.stats.generated_tokens += len(tokens)
        self.stats.finish_reason = finished
        logprobs = None if logits is None else token_logprobs(logits, tokens, self.opts.logprobs)
        return Step(tokens, accepted, rejected, finished, logprobs)
