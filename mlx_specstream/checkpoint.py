"""Training checkpoints: the adapter's weights, the optimizer's state and the run's state at a
step (and the best adapter so far), each in ``OUT.train/checkpoints/step-NNNNNNN``, written
whole (a temporary directory, then a rename) so an interrupted run resumes from the last one.
With its adapter config beside the weights, a checkpoint also loads as an adapter, to try a long
run before it ends."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from .adapter import CONFIG_FILE, WEIGHTS_FILE, adapter_weights
from .outputs import save_safetensors


def _set_path(tree, path: list[str], value) -> None:
    for k in path[:-1]:
        tree = tree[int(k)] if isinstance(tree, list) else tree[k]
    last = path[-1]
    if isinstance(tree, list):
        tree[int(last)] = value
    else:
        tree[last] = value


def checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.glob("step-*") if (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


BEST_FILE = "best.safetensors"


def save_checkpoint(model, optimizer, ckpt_dir: Path, step: int, state: dict, keep: int = 2,
                    best: dict[str, mx.array] | None = None) -> Path:
    """Adapter weights, optimizer state and the run's state at ``step`` (and the best adapter so
    far, by acceptance), written atomically."""
    from .loader import atomic_dir

    dest = ckpt_dir / f"step-{step:07d}"
    with atomic_dir(dest, "checkpoint", overwrite=True) as tmp:
        save_safetensors(tmp / WEIGHTS_FILE, adapter_weights(model))
        # its config beside them: a checkpoint is an adapter too (generate --adapter .../step-N)
        (tmp / CONFIG_FILE).write_text(json.dumps(asdict(model.adapter_config), indent=2))
        flat = dict(tree_flatten(optimizer.state))
        save_safetensors(tmp / "optimizer.safetensors", flat)
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2))
        if best is not None:
            save_safetensors(tmp / BEST_FILE, best)
    for old in checkpoints(ckpt_dir)[:-keep] if keep else []:
        shutil.rmtree(old, ignore_errors=True)
    return dest


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (damaged or incomplete: written whole, it was changed
    after), in one line."""


def load_checkpoint(model, optimizer, path: Path) -> dict:
    try:
        state = json.loads((path / "state.json").read_text())
        weights = mx.load(str(path / WEIGHTS_FILE))
        saved = mx.load(str(path / "optimizer.safetensors"))
    except (OSError, ValueError, RuntimeError) as e:  # MLX: RuntimeError for a truncated file
        raise CheckpointError(f"{path}: unreadable checkpoint ({str(e).splitlines()[0]})") from None
    current = adapter_weights(model)
    if set(weights) != set(current) or any(weights[k].shape != current[k].shape for k in weights):
        raise ValueError(f"{path}: checkpoint does not match this adapter's configuration")
    model.load_weights(list(weights.items()), strict=False)
    optimizer.init(model.trainable_parameters())
    have = dict(tree_flatten(optimizer.state))
    if set(saved) != set(have):
        raise ValueError(f"{path}: optimizer state does not match this adapter")
    for k, v in saved.items():
        _set_path(optimizer.state, k.split("."), v)
    mx.eval(model.parameters(), optimizer.state)
    return state

