"""Where the project's own files are: the shipped model (``models/``) and data sets (``data/``).

Both live in the repository beside the package, so a clone installed in place
(``pip install -e .``, what ``scripts/setup.sh`` does) has them; a copy of the package in
site-packages (``pip install .``, a wheel) does not, and there :func:`default_model` and
:func:`project_data` say in one line what to pass instead.
"""

from __future__ import annotations

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPOSITORY / "models" / "specstream-tiny" / "mlx"
PROJECT_DATA = REPOSITORY / "data"
_ELSEWHERE = ("this installation has no {what} ({folder} of the mlx-specstream repository, which only "
              "a clone installed with `pip install -e .` has)")


def default_model() -> Path:
    """The shipped model's MLX directory, or an OptionError asking for ``{model}``."""
    from .errors import OptionError

    if not DEFAULT_MODEL.is_dir():
        raise OptionError("no {model} given and " + _ELSEWHERE.format(what="default model",
                                                                      folder="models/"))
    return DEFAULT_MODEL


def project_data(task: str) -> Path:
    """The project's data set ``task`` (``sql``, ``code``), or an OptionError naming ``{task}``."""
    from .errors import OptionError

    if not PROJECT_DATA.is_dir():
        raise OptionError(f"{{task={task}}}: " + _ELSEWHERE.format(what="project data sets",
                                                                     folder="data/"))
    return PROJECT_DATA / task
