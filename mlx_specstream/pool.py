"""One base model in memory, many adapters: the models a server picks from by id.

Each adapter gets its own module tree whose base layers hold the *same* arrays as the base model
(:func:`share_base`), so an adapter costs only its own parameters and requests for different
adapters never swap weights under each other. The server never fuses them: folding a shared-mode
LoRA into the base weights would give that adapter a private copy of them (``bench`` does, for
``generate``'s speed: :func:`with_adapter`).
"""

from __future__ import annotations

import copy
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .adapter import adapter_name, adapter_size, available_adapters, load_adapter, resolve_adapter
from .adapter import fuse as fuse_adapter
from .errors import OptionError
from .loader import model_name


class UnknownModelError(ValueError):
    """A request names a model id that this pool does not serve."""


def share_base(model: nn.Module) -> nn.Module:
    """A new module tree over the same parameter arrays (nothing is copied): attaching an
    adapter to the result leaves ``model`` as it was."""

    def clone(x):
        if isinstance(x, nn.Module):
            c = copy.copy(x)  # a new container with the same entries and attributes
            for k, v in x.items():
                c[k] = clone(v)
            return c
        if isinstance(x, list):
            return [clone(v) for v in x]
        if isinstance(x, dict):
            return {k: clone(v) for k, v in x.items()}
        return x  # arrays (and settings) are shared

    return clone(model)


def with_adapter(base: nn.Module, adapter: str | Path, fuse: bool = False) -> nn.Module:
    """``base`` (as :func:`~mlx_specstream.api.load` gave it) with ``adapter`` attached, over
    the base's own arrays: ``load(path, adapter, fuse)``'s model, but only the adapter's
    parameters are new, and with ``fuse`` (``generate``'s speed) the layers its fine-tune folds
    into."""
    model = share_base(base)
    load_adapter(model, adapter, model_path=base.path)
    if fuse:
        fuse_adapter(model)
    return model


class ModelPool:
    """The base model and the requested adapters over it, by model id (``base``, ``base:ADAPTER``)."""

    def __init__(self, path: str | Path, adapters: str | list[str] | None = None, name: str | None = None):
        from .api import load

        if name is not None and (not isinstance(name, str) or not name.strip() or name != name.strip()):
            raise OptionError(f"{{name}} must be a model id (text, no space at either end), not {name!r}")
        self.path = Path(path)
        self.base, self.tokenizer = load(self.path)
        self.base_id = name or model_name(self.path)
        if isinstance(adapters, str) and adapters != "all":  # "sql" or "sql,code", as --adapters
            adapters = [a.strip() for a in adapters.split(",") if a.strip()]
            if not adapters:
                raise ValueError("--adapters names no adapter: give names, or leave it out to serve the "
                                 "base alone")
        names = available_adapters(self.path) if adapters == "all" else list(adapters or [])
        self.models: dict[str, nn.Module] = {self.base_id: self.base}
        served = set()
        for adapter in names:
            found = resolve_adapter(self.path, adapter)
            where = (adapter_name(found), found.resolve())  # its id, and what it is
            if where in served:  # named twice ("sql,sql", or by name and by path): served once; a
                continue  # symlinked alias of another name is an id of its own
            served.add(where)
            model = with_adapter(self.base, adapter)
            cfg = model.adapter_config
            model_id = f"{self.base_id}:{cfg.name}"
            if model_id in self.models:
                raise ValueError(f"two adapters named '{cfg.name}' ({adapter} and an earlier one): "
                                 "each is served under its directory's name; rename one")
            self.models[model_id] = model
        for model in self.models.values():
            warm_up(model)

    def get(self, model_id: str) -> nn.Module:
        if model_id not in self.models:
            raise UnknownModelError(f"the model '{model_id}' does not exist; this server has: "
                                    f"{', '.join(self.models)}")
        return self.models[model_id]

    def describe(self) -> list[dict]:
        """One entry per model id: its adapter's mode and size (0 for the base)."""
        out = []
        for model_id, model in self.models.items():
            cfg = getattr(model, "adapter_config", None)
            out.append({"id": model_id, "adapter_mode": cfg.mode if cfg else None,
                        "adapter_params": adapter_size(model) if cfg else 0,
                        "speculative": default_mode(model) == "ss"})
        return out


def warm_up(model: nn.Module) -> None:
    """Decode two tokens on this thread: every array a decode touches is computed here, since
    MLX cannot evaluate, on the scheduler's thread, a lazy array built on another (and the
    first requests do not pay for the first passes)."""
    from .api import generate

    mx.eval(model.parameters())
    generate(model, None, [0], max_tokens=2, mode=default_mode(model))


def default_mode(model: nn.Module) -> str:
    """How a model id decodes by default: "ss" where its adapter has streams, else "ar"."""
    cfg = getattr(model, "adapter_config", None)
    return "ss" if cfg is not None and cfg.gamma else "ar"


