"""A training run under way: its steps (the gradients of each global batch, shared out over the
processes), its validations and checkpoints, and the adapter it keeps at the end.

:func:`~mlx_specstream.trainer.train` checks its arguments, loads the data and builds a
:class:`Run`; :func:`train_steps` takes it from its first step (or its checkpoint's) to the last,
:func:`final_evaluation` picks the adapter that is kept. What a step minimizes is
``objective.py``; the order of the batches, ``train_batches.py``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from .adapter import adapter_weights
from .base_states import BaseStateCache
from .checkpoint import BEST_FILE, check_same_run, checkpoints, save_checkpoint
from .data import Dataset
from .errors import OptionError, Said
from .objective import acceptance, drafts_better, evaluate, grad_step
from .outputs import terminate_cleanly
from .process_group import PeerStopped
from .train_batches import Batch

if TYPE_CHECKING:
    from .trainer import TrainConfig

SHARED_QUALITY_SLACK = 0.01  # a shared adapter kept for its drafts may predict at most 1 % worse

# what a resumed run must share with its checkpoint: its TrainConfig but these fields, its data's
# digests and its fine-tune's weights; RECORDED_ONLY are compared only where the checkpoint has them
NOT_COMPARED = ("iters", "val_every", "save_every", "state_cache_mb", "over", "init")
RECORDED_ONLY = ("data", "valid_data", "accept_prompts", "accept_tokens", "branch", "tree_budget",
                  "warmup", "val_batches", "over_weights")


def check_resumable(path: Path, state: dict, base_fp: str, compat: dict, iters: int,
                    length: str = "{iters=%d}") -> None:
    """Refuse to resume from the checkpoint ``path`` (its recorded ``state``) a run on another base
    model, with other settings, or shorter than the step it is at (``length``: how the run's
    length was given, ``%d`` its steps)."""
    if state.get("base_fingerprint") != base_fp:
        raise ValueError(f"{path}: checkpoint was made on another base model (fingerprint "
                         f"{state.get('base_fingerprint')}; this one {base_fp}): resume with the model it "
                         "was trained on")
    check_same_run(path, state["config"], compat, RECORDED_ONLY)
    if int(state["step"]) > iters:
        raise OptionError(f": the run is already at step {state['step']}, past {length % iters}",
                          subject=str(path))


@dataclass
class Run:
    """A run under way: what its steps, validations and checkpoints share, and what it has done so
    far (``start`` to ``best``: saved with every checkpoint, restored by :meth:`restore`)."""

    model: nn.Module
    optimizer: optim.Optimizer
    tc: TrainConfig
    train_ds: Dataset
    valid_ds: Dataset | None
    batch: Callable[[int], list[int]]  # step (from 0) -> the global batch's example indices
    compat: dict  # what a resumed run must share with its checkpoint (the run's config and digests)
    base_fp: str
    group: object  # the processes (None: this one alone)
    say: Callable[[object], None]
    ckpt_dir: Path | None
    keep_checkpoints: int
    eos: set[int]
    accept_set: list[list[int]]  # validation prompts whose drafts are measured (no streams: none)
    start: int = 0  # the step the run continues from
    history: list[dict] = field(default_factory=list)
    val_history: list[dict] = field(default_factory=list)
    seconds: float = 0.0  # trained before this process took the run up
    # the adapter with the most accepted tokens per pass on the validation prompts so far
    best: dict = field(default_factory=lambda: {"step": None, "mean_accepted_tokens": -1.0, "weights": None})

    @property
    def main(self) -> bool:
        """Whether this process writes: the first of the group."""
        return self.group is None or self.group.rank() == 0

    @property
    def saves(self) -> bool:
        return self.ckpt_dir is not None and self.main

    def restore(self, path: Path, state: dict) -> None:
        """Continue from the checkpoint in ``path`` (its weights and optimizer state already loaded),
        whose ``state`` must be this run's (:func:`check_resumable`: ``train`` checks the last
        checkpoint's before the run's work begins; one kept before it, read where the last is
        damaged, is checked here)."""
        check_resumable(path, state, self.base_fp, self.compat, self.tc.iters)
        self.start = int(state["step"])
        self.history, self.val_history = state.get("history", []), state.get("val_history", [])
        self.seconds = float(state.get("seconds", 0.0))
        if (path / BEST_FILE).is_file() and state.get("best"):
            self.best = {**state["best"], "weights": mx.load(str(path / BEST_FILE))}

    def save(self, step: int, seconds: float) -> Path:
        """A checkpoint of ``step``, ``seconds`` into this process's share of the run."""
        state = {"config": self.compat, "settings": asdict(self.tc), "iters": self.tc.iters,
                 "base_fingerprint": self.base_fp, "history": self.history, "val_history": self.val_history,
                 "seconds": self.seconds + seconds,
                 "world_size": self.group.size() if self.group is not None else 1,
                 "best": {k: v for k, v in self.best.items() if k != "weights"}}
        return save_checkpoint(self.model, self.optimizer, self.ckpt_dir, step, state, self.keep_checkpoints,
                               self.best["weights"])

    def validation_due(self, step: int) -> bool:
        every = self.tc.val_every
        return self.valid_ds is not None and bool(every) and (step % every == 0 or step == self.tc.iters)

    def validate(self, step: int) -> dict:
        """Validation losses and accuracies, and the acceptance a user will see; keeps the best."""
        tc = self.tc
        ev = evaluate(self.model, self.valid_ds, tc, max_batches=tc.val_batches, group=self.group)
        if self.accept_set:
            ev["mean_accepted_tokens"], ev["accepted_per_prompt"] = acceptance(
                self.model, self.accept_set, tc.accept_tokens, self.eos, self.group)
            scored = {"mean_accepted_tokens": ev["mean_accepted_tokens"],
                      "per_prompt": ev["accepted_per_prompt"], "loss": ev["loss"],
                      "main_loss": ev["main_loss"]}
            if drafts_better(scored, self.best, by="main_loss" if tc.mode == "shared" else "loss"):
                self.best.update(step=step, **scored, weights=dict(adapter_weights(self.model)))
        return ev


def plan_line(run: Run, n_params: int, steps_per_epoch: int, progress: bool) -> str:
    """The line that says what a run will do."""
    tc = run.tc
    epochs = tc.iters / steps_per_epoch
    examples = len(run.train_ds.examples)
    batch = f"{tc.batch_size}" if tc.batch_size <= examples else \
        f"{examples} (all the examples: fewer than the batch size, {tc.batch_size})"
    if run.group is not None:  # data-parallel: each process takes its share of every batch
        batch += f", shared by {run.group.size()} processes"
    said = [f"{tc.mode}" + (f", γ = {tc.gamma}" if tc.gamma else ""), f"{n_params:,} trainable parameters",
            f"{tc.iters} step{'s' * (tc.iters != 1)} ({epochs:.3g} epoch{'s' * (epochs != 1)} of "
            f"{steps_per_epoch} "
            f"batch{'es' * (steps_per_epoch != 1)} of {batch})", f"lr {tc.lr:g}, warmup {tc.warmup}"
            + ("" if tc.warmup < tc.iters else " (none: the run has 1 step)" if tc.iters == 1
               else f" (cut to {tc.iters - 1}: the run has {tc.iters} steps)"),
            (f"validation every {tc.val_every} steps and at the end" if 0 < tc.val_every < tc.iters
             else "validation at the end") if run.valid_ds is not None else "no validation"]
    return ("train: " + ", ".join(said) + (f"; from step {run.start}" if run.start else "")
            + ("; the bar's loss: the main and stream losses weighted by alphas, and the early exit's"
               if tc.gamma and progress else ""))


def _validation_line(step: int, ev: dict, tc: TrainConfig, prompts: int) -> str:
    """What a validation found, on one line."""
    accs = " ".join(f"{a:.3f}" for a in ev["stream_acc"])
    per_pass = ev.get("mean_accepted_tokens")
    said = [f"val loss {ev['loss']:.4f}", f"main top-1 acc {ev['main_acc']:.3f}"]
    if tc.mode != "lossless":  # the adapter writes the output: how well the main stream predicts it
        said[1:1] = [f"main loss {ev['main_loss']:.4f}"]
    if tc.gamma:  # a lora adapter has no streams and no early exit
        said[-1:-1] = [f"stream top-1 acc [{accs}]"]
        said.append(f"early exit {ev['prune_acc']:.3f}")
    if per_pass:
        said.append(f"{per_pass:.2f} tokens/pass on {prompts} prompt{'s' * (prompts != 1)}")
    elif per_pass is not None:  # measured, and no pass ran: nothing was generated
        said.append("no tokens/pass: every validation prompt ended at its first token")
    return f"step {step}: " + ", ".join(said)


def train_steps(run: Run, *, progress: bool, callback) -> tuple[float, int, float]:
    """Train from ``run.start`` to the last step, validating and saving checkpoints when due; a stop
    (Ctrl-C, SIGTERM) saves the steps done first. Returns the seconds taken, the tokens trained on
    and the seconds of validation among them (not training: kept out of its tokens per second)."""
    from tqdm import tqdm

    tc, model, optimizer, say = run.tc, run.model, run.optimizer, run.say
    cache = (BaseStateCache(tc.state_cache_mb << 20) if tc.mode == "lossless" and tc.state_cache_mb > 0
             else None)
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    tokens_seen, val_seconds = 0, 0.0
    last_saved = applied = run.start  # applied: the last step whose update the weights hold
    bar = tqdm(total=tc.iters, initial=run.start, desc=f"train {tc.mode}", disable=not progress,
               dynamic_ncols=True, file=sys.stderr)

    def validation(step: int) -> None:
        nonlocal val_seconds
        t = time.perf_counter()
        bar.set_description_str(f"validate step {step}")  # it has no bar of its own: say what runs
        ev = run.validate(step)
        bar.set_description_str(f"train {tc.mode}")
        val_seconds += time.perf_counter() - t
        run.val_history.append({"step": step, **ev})
        say(_validation_line(step, ev, tc, len(run.accept_set)))
        if per_pass := ev.get("mean_accepted_tokens"):
            shown = getattr(bar, "postfix", None)  # the step's loss (a disabled bar has none)
            bar.set_postfix_str(", ".join(filter(None, [shown, f"tok_pass={per_pass:.2f}"])))

    def history_entry(step: int, loss: mx.array) -> dict:
        dt = time.perf_counter() - t0 - val_seconds
        return {"step": step, "loss": round(float(loss.item()), 6),
                "lr": float(optimizer.learning_rate.item()) if hasattr(optimizer, "learning_rate") else tc.lr,
                "tokens_per_second": round(tokens_seen / dt, 1) if dt else 0.0}

    try:
        with terminate_cleanly():  # SIGTERM saves a checkpoint, as Ctrl-C does
            start = run.start
            if 0 < start < tc.iters and run.validation_due(start) and start not in [
                    v["step"] for v in run.val_history]:
                validation(start)  # the checkpoint was saved by a stop during this validation
            for step in range(start + 1, tc.iters + 1):
                ids = run.batch(step - 1)
                loss, grads = batch_gradients(model, run.train_ds, ids, tc, run.group, cache)
                if tc.grad_clip:
                    grads, _ = optim.clip_grad_norm(grads, tc.grad_clip)
                optimizer.update(model, grads)
                applied = step
                mx.eval(model.trainable_parameters(), optimizer.state, loss)
                tokens_seen += sum(len(run.train_ds.examples[i].tokens) for i in ids)
                info = history_entry(step, loss)
                if not math.isfinite(info["loss"]):
                    raise OptionError(f"step {step}: the training loss is {info['loss']}: the run diverged "
                                      "(try a smaller learning rate, {lr}); no adapter is saved")
                run.history.append(info)
                bar.update(1)
                bar.set_postfix(loss=f"{info['loss']:.3f}", tok_s=f"{info['tokens_per_second']:.0f}")
                if run.validation_due(step):
                    validation(step)
                if run.saves and (step == tc.iters or (tc.save_every and step % tc.save_every == 0)):
                    run.save(step, time.perf_counter() - t0)
                    last_saved = step
                if _stopped_by(callback, step, info, run.group) and step < tc.iters:
                    say(f"the callback stopped the run at step {step} of {tc.iters}")
                    tc.iters = step  # a run of this many steps, validated and saved as one
                    done = run.val_history and run.val_history[-1]["step"] == step
                    if run.validation_due(step) and not done:
                        validation(step)
                    if run.saves and last_saved < step:
                        run.save(step, time.perf_counter() - t0)
                        last_saved = step
                    break
    except (KeyboardInterrupt, PeerStopped) as stop:  # PeerStopped: a SIGTERM to the whole group
        bar.close()  # can stop another process before this one sees its own
        done = applied  # a signal lands after a step's update, maybe before its history entry
        if done > run.start and (not run.history or run.history[-1]["step"] < done):
            run.history.append(history_entry(done, loss))
        if run.saves and done > last_saved:  # the same weights everywhere
            dest = run.save(done, time.perf_counter() - t0)
            why = "stopped: " if isinstance(stop, PeerStopped) else ""  # a signal: the caller says it
            say(Said("; continue with {resume=True}", subject=f"{why}saved {dest}"))
        raise
    bar.close()
    return time.perf_counter() - t0, tokens_seen, val_seconds


def _stopped_by(callback, step: int, info: dict, group) -> bool:
    """Whether ``callback(step, info)`` returned False (stop now), agreed by every process of
    ``group`` (the first one's callback decides; the others have none)."""
    stop = callback is not None and callback(step, info) is False
    if group is not None:
        stop = bool(group.all_sum(mx.array(int(stop))).item())
    return stop


def final_evaluation(run: Run) -> tuple[dict | None, int]:
    """The validation of the last step (run now where it was not validated), and the step whose
    adapter the model keeps: an earlier one that drafts better, unless (shared mode, where the
    adapter writes the output) its main stream predicts the validation data worse than the final
    one's."""
    iters, best, say = run.tc.iters, run.best, run.say
    final_eval = run.val_history[-1] if run.val_history and run.val_history[-1]["step"] == iters else None
    if run.valid_ds is not None and final_eval is None:
        try:
            final_eval = {"step": iters, **run.validate(iters)}
        except (KeyboardInterrupt, PeerStopped):
            if run.saves and (saved := checkpoints(run.ckpt_dir)):
                say(Said(" holds the last step; {resume=True} finishes the run",
                         subject=f"the final evaluation was cut short: {saved[-1]}"))
            raise
    earlier = (best["weights"] is not None and best["step"] != iters  # an earlier adapter drafts better
               and "mean_accepted_tokens" in (final_eval or {}))
    # older checkpoints did not record the main loss: their best is kept on its drafts
    if earlier and run.tc.mode == "shared" and (
            best.get("main_loss", -math.inf) > final_eval["main_loss"] * (1 + SHARED_QUALITY_SLACK)):
        say(f"keeping the final adapter: step {best['step']} drafted more "
            f"({best['mean_accepted_tokens']:.2f} tokens per pass against "
            f"{final_eval['mean_accepted_tokens']:.2f}) but its main stream predicts the validation data "
            f"worse (loss {best['main_loss']:.4f} against {final_eval['main_loss']:.4f})")
    elif earlier:
        run.model.load_weights(list(best["weights"].items()), strict=False)
        say(f"keeping the adapter of step {best['step']}: {best['mean_accepted_tokens']:.2f} tokens per "
            f"pass on the validation prompts (validation loss {best.get('loss', math.nan):.4f}), against "
            f"{final_eval['mean_accepted_tokens']:.2f} ({final_eval['loss']:.4f}) at the end")
        return final_eval, best["step"]
    return final_eval, iters


def _all_sum(tree, group):
    """The tree of arrays summed over the processes in one message (one per array would pay the
    transport's latency for each of the adapter's ~60 arrays and the loss)."""
    leaves = tree_flatten(tree)
    flat = group.all_sum(mx.concatenate([v.reshape(-1) for _, v in leaves]))
    cuts = np.cumsum([v.size for _, v in leaves])[:-1].tolist()
    return tree_unflatten([(k, x.reshape(v.shape)) for (k, v), x in zip(leaves, mx.split(flat, cuts))])


def batch_gradients(model, dataset: Dataset, ids: list[int], tc: TrainConfig, group=None,
                    cache: BaseStateCache | None = None) -> tuple[mx.array, dict]:
    """Loss and gradients of the global batch ``dataset.examples[ids]``: this process computes its
    share (:func:`share_gradients`) and the group sums them."""
    loss, grads = share_gradients(model, dataset, ids, tc, group, cache)
    if group is not None:
        grads, loss = _all_sum([grads, loss], group)
    return loss, grads


def share_gradients(model, dataset: Dataset, ids: list[int], tc: TrainConfig, group=None,
                    cache: BaseStateCache | None = None) -> tuple[mx.array, dict]:
    """This process's share of the loss and gradients of the global batch ``dataset.examples[ids]``:
    those of its examples, normalised by the global counts of valid targets."""
    rank, size = (group.rank(), group.size()) if group is not None else (0, 1)
    shard = list(ids)[rank::size]  # a batch is sorted by length: every process gets short and long
    examples = [dataset.examples[i] for i in shard]
    norms = Batch.of([dataset.examples[i] for i in ids]).counts(tc.gamma)  # the same on every process
    batch = Batch.of(examples) if examples else None
    states = cache.states(model, list(shard), examples) if cache is not None and examples else None
    return grad_step(model, batch, tc, norms, states)
