"""``migscale``: the command-line front of every capability.

Each capability registers its commands from its own module under
``autoscaler/commands/`` (a ``register(app)`` function), so the CLI stays a
thin router and the modules stay independent. Config and usage errors exit 2
with a one-line message per problem, never a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

import autoscaler.commands as _commands

app = typer.Typer(
    name="migscale",
    help="Inference-serving autoscaler for NVIDIA Triton on MIG slices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for mod in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"autoscaler.commands.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
