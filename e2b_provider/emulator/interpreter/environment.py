"""The Python environment of the emulator's ``code-interpreter-v1`` template: where it is,
whether it is complete, and how it is built.

E2B's template installs Jupyter, ``ipykernel``, ``bash_kernel`` and the data packages into
its image; the emulator's sandboxes share the host's files, so the template's kernels run
from one virtual environment on the host, bound read-only into each such sandbox at the same
path. It lives at ``$E2B_EMULATOR_CODE_ENV``, else in the user's cache
(``$XDG_CACHE_HOME/e2b-provider/code-interpreter``, by default under ``~/.cache``), shared by
every checkout and install of this user. ``./dev code-env`` builds it (``python -m
e2b_provider.emulator.interpreter.environment``); building again with the same requirements
does nothing. Other templates never need it.
Standard library only: the emulator's control plane imports this.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

import attrs

__all__ = [
    "BUILD_COMMAND",
    "DENO",
    "ENV_VAR",
    "JS_KERNEL",
    "REQUIREMENTS",
    "CodeEnv",
    "CodeEnvMissing",
    "build",
    "default_dir",
    "find",
]

#: The variable naming the environment's directory.
ENV_VAR = "E2B_EMULATOR_CODE_ENV"
#: What the template's kernels and server need (E2B's template pins more; these are the
#: packages its protocol and its rich results rely on). The libraries users' code calls stay
#: on the release lines E2B's template pins (matplotlib 3.10, pandas 2.2, Pillow 12, NumPy
#: 2.3): a later line changes what the same code does (matplotlib 3.11 refuses
#: ``boxplot(labels=...)``, pandas 3 infers other dtypes).
REQUIREMENTS = (
    "ipykernel>=6.29",
    "jupyter_client>=8.6",
    "bash_kernel>=0.9",
    "aiohttp>=3.9,<4",
    "matplotlib>=3.10,<3.11",
    "pandas>=2.2,<2.3",
    "numpy>=2.3,<2.4",
    "pillow>=12,<13",
    "orjson>=3.9",
    "e2b-charts>=0.1",
)
#: The JavaScript and TypeScript kernel: Deno's (``deno jupyter``), from the npm registry
#: (the package brings the binary for this platform). E2B's template runs a Node kernel
#: (``ijavascript``) instead; what its tests ask of one (``console.log``, ``import`` of
#: Node's modules, top-level ``await``, TypeScript, ``process.env`` and ``process.cwd()``),
#: Deno's does too.
DENO = "deno@2.9.6"
#: The name of that kernel's spec (E2B's: both languages run in its ``javascript`` kernel).
JS_KERNEL = "javascript"
#: The file written last by a build: its requirements (a build without it is unfinished).
STAMP = "e2b-provider-code-env.json"
#: The command that builds it, as error messages name it.
BUILD_COMMAND = "./dev code-env (or: python -m e2b_provider.emulator.interpreter.environment)"


class CodeEnvMissing(Exception):
    """The environment is not there or not complete (the message names the command)."""


@attrs.frozen
class CodeEnv:
    """A built environment.

    Attributes:
        directory: its directory (absolute, real).
        python: its interpreter.
        binds: host directories a sandbox needs to run it (it, and its base interpreter's).
    """

    directory: str
    python: str
    binds: List[str]


def default_dir() -> str:
    """``$E2B_EMULATOR_CODE_ENV``, else ``e2b-provider/code-interpreter`` in the user's cache
    directory (``$XDG_CACHE_HOME``, default ``~/.cache``)."""
    named = os.environ.get(ENV_VAR)
    if named:
        return os.path.abspath(named)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(cache), "e2b-provider", "code-interpreter")


def _base_prefix(python: str) -> str:
    """The prefix of the interpreter a virtual environment's ``python`` runs (its links
    followed): its standard library is below it."""
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))


def find(directory: Optional[str] = None) -> CodeEnv:
    """The built environment at ``directory`` (default :func:`default_dir`).

    Raises:
        CodeEnvMissing: it is not there, or its build did not finish or is out of date.
    """
    where = os.path.abspath(directory or default_dir())
    python = os.path.join(where, "bin", "python")
    try:
        with open(os.path.join(where, STAMP), encoding="utf-8") as f:
            built = json.load(f)
    except (OSError, ValueError):
        built = None
    if not os.access(python, os.X_OK) or built is None:
        raise CodeEnvMissing(
            f"the code-interpreter template needs its Python environment at {where}; "
            f"build it with {BUILD_COMMAND}"
        )
    if built.get("requirements") != list(REQUIREMENTS) or built.get("deno") != DENO:
        raise CodeEnvMissing(
            f"the code-interpreter template's Python environment at {where} is out of date; "
            f"build it again with {BUILD_COMMAND}"
        )
    real = os.path.realpath(where)
    return CodeEnv(directory=real, python=os.path.join(real, "bin", "python"),
                   binds=[real, _base_prefix(python)])


def build(directory: str, python: str = sys.executable, quiet: bool = True) -> CodeEnv:
    """Build (or finish, or bring up to date) the environment at ``directory``.

    Makes a virtual environment with ``python``, installs :data:`REQUIREMENTS`, the Bash
    kernel's spec and Deno's kernel (:data:`DENO`, with npm) into it, then writes the stamp.
    Readable by everyone (a root-mode sandbox's root is not host root).

    Raises:
        subprocess.CalledProcessError: venv, pip or npm failed (their output went to stderr).
        CodeEnvMissing: npm is not there (the message says how to get it).
    """
    where = os.path.abspath(directory)
    try:
        return find(where)
    except CodeEnvMissing:
        pass
    npm = shutil.which("npm")
    if npm is None:  # found out before the long part
        raise CodeEnvMissing(
            "the code-interpreter template's JavaScript kernel (Deno) comes from the npm "
            "registry, and npm is not installed: install Node.js and npm (Debian: apt-get "
            f"install npm), then build again with {BUILD_COMMAND}"
        )
    try:
        os.unlink(os.path.join(where, STAMP))
    except FileNotFoundError:
        pass
    old = os.umask(0o022)
    try:
        if not os.access(os.path.join(where, "bin", "python"), os.X_OK):
            subprocess.run([python, "-m", "venv", where], check=True)
        env_python = os.path.join(where, "bin", "python")
        pip = [env_python, "-m", "pip", "install", "--disable-pip-version-check"]
        if quiet:
            pip.append("-q")
        subprocess.run(pip + list(REQUIREMENTS), check=True)
        subprocess.run([env_python, "-m", "bash_kernel.install", "--sys-prefix"], check=True,
                       stdout=subprocess.DEVNULL)
        _install_deno(where, npm, quiet)
        with open(os.path.join(where, STAMP), "w", encoding="utf-8") as f:
            json.dump({"requirements": list(REQUIREMENTS), "deno": DENO}, f)
    finally:
        os.umask(old)
    return find(where)


def _install_deno(where: str, npm: str, quiet: bool) -> None:
    """Install :data:`DENO` with ``npm`` below ``where`` and write its kernel's spec
    (:data:`JS_KERNEL`) into the environment: no colors in results, no update check.

    Raises:
        subprocess.CalledProcessError: npm failed.
    """
    prefix = os.path.join(where, "deno")
    command = [npm, "install", "--prefix", prefix, "--no-audit", "--no-fund",
               "--no-save", DENO]
    if quiet:
        command.append("--loglevel=error")
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL if quiet else None)
    deno = os.path.realpath(os.path.join(prefix, "node_modules", ".bin", "deno"))
    spec = os.path.join(where, "share", "jupyter", "kernels", JS_KERNEL)
    os.makedirs(spec, exist_ok=True)
    with open(os.path.join(spec, "kernel.json"), "w", encoding="utf-8") as f:
        json.dump({
            "argv": [deno, "jupyter", "--kernel", "--conn", "{connection_file}"],
            "display_name": "JavaScript and TypeScript (Deno)",
            "language": "typescript",
            "env": {"NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"},
        }, f)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m e2b_provider.emulator.interpreter.environment [--dir DIR] [--check]``."""
    parser = argparse.ArgumentParser(
        prog="python -m e2b_provider.emulator.interpreter.environment",
        description="Build the Python environment of the emulator's code-interpreter-v1 "
        "template (Jupyter kernels for Python, Bash and JavaScript/TypeScript, matplotlib, "
        "pandas, numpy, e2b-charts).",
    )
    parser.add_argument("--dir", default=None,
                        help=f"where (default ${ENV_VAR}, else ~/.cache/e2b-provider/"
                        "code-interpreter)")
    parser.add_argument("--check", action="store_true", help="only say whether it is built")
    args = parser.parse_args(argv)
    try:
        found = find(args.dir) if args.check else build(args.dir or default_dir())
    except CodeEnvMissing as exc:
        print(f"code-env: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"code-env: {exc}", file=sys.stderr)
        return 1
    print(f"code-env: ready at {found.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
