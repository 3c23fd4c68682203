"""The one root Dockerfile, parsed: its targets exist, every path it copies exists and the
build context keeps it, every stage it copies from is defined, the build stage has every
package root, each target's entrypoint runs (from this checkout), and each image ends as a
non-root user. tests/integration/test_images.py builds the images for real and runs each
entrypoint from its image's own file system."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
TARGETS = ("broker", "operator", "consumer", "spark")


@dataclass
class Stage:
    name: str
    base: str  # an image, or an earlier stage's name
    instructions: list[tuple[str, str]] = field(default_factory=list)


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in (raw.strip() for raw in text.splitlines())
            if line and not line.startswith("#")]


def parse(path: Path) -> list[Stage]:
    """The stages, in order; ``ARG``s before the first ``FROM`` are substituted in bases."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for op, args in instructions(path):
        if op == "FROM":
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), ""), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, base))
        elif not stages:
            if op == "ARG":
                key, _, value = args.partition("=")
                global_args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append((op, args))
    return stages


STAGES = parse(DOCKERFILE)
BY_NAME = {stage.name: stage for stage in STAGES}


def chain(name: str) -> list[tuple[str, str]]:
    """A stage's instructions with those of the stages it is built ``FROM``."""
    stage = BY_NAME[name]
    inherited = chain(stage.base) if stage.base in BY_NAME else []
    return [*inherited, *stage.instructions]


def copy_from(args: str) -> str | None:
    match = re.match(r"--from=(\S+)", args)
    return match.group(1) if match else None


def test_the_targets_exist() -> None:
    names = [stage.name for stage in STAGES]
    assert len(names) == len(set(names)), names
    assert set(TARGETS) <= set(names)
    assert "build" in names


def test_every_base_image_is_python_3_11_slim() -> None:
    for stage in STAGES:
        if stage.base not in BY_NAME:
            assert stage.base.startswith("python:3.11-slim"), (stage.name, stage.base)


def test_copy_from_names_an_earlier_stage() -> None:
    seen: set[str] = set()
    for stage in STAGES:
        for op, args in stage.instructions:
            if op == "COPY" and (source := copy_from(args)) is not None:
                assert source in seen, f"{stage.name}: COPY --from={source} is no earlier stage"
        seen.add(stage.name)


def test_copied_paths_exist_and_are_not_ignored() -> None:
    ignored = [line.strip().rstrip("/") for line in
               (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copies = [args for stage in STAGES for op, args in stage.instructions
              if op in ("COPY", "ADD") and copy_from(args) is None]
    assert copies
    for args in copies:
        *sources, _ = shlex.split(args)
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source} does not exist"
            prefixes = ["/".join(source.split("/")[:i + 1]) for i in range(source.count("/") + 1)]
            for pattern in ignored:
                assert not any(fnmatch.fnmatch(p, pattern) for p in prefixes), \
                    f"{source} is in .dockerignore ({pattern})"


def test_the_build_stage_copies_every_package_root() -> None:
    # The distribution's package roots (pyproject) are all copied: `pip install .` needs them.
    build = BY_NAME["build"].instructions
    assert any(op == "RUN" and re.search(r"pip install [^&]* \.(\s|$)", args)
               for op, args in build)
    roots = re.search(r'where = \[(.*?)\]', (ROOT / "pyproject.toml").read_text())
    assert roots is not None
    copied = {shlex.split(args)[0] for op, args in build if op == "COPY"}
    for root in re.findall(r'"([^"]+)"', roots.group(1)):
        assert root.split("/")[0] in copied, f"the build stage does not copy {root}"


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_has_the_distribution(target: str) -> None:
    assert any(op == "COPY" and copy_from(args) == "build" for op, args in chain(target))


def test_nothing_is_cached_in_the_images() -> None:
    runs = [args for stage in STAGES for op, args in stage.instructions if op == "RUN"]
    for args in runs:
        if "pip install" in args:
            # pip's cache is off, or in a cache mount (kept by the builder, not the image).
            assert "--no-cache-dir" in args or \
                "--mount=type=cache,target=/root/.cache/pip" in args, args
        if "apt-get install" in args:
            assert "--no-install-recommends" in args, args
            assert "rm -rf /var/lib/apt/lists" in args, args


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_runs_as_a_non_root_user(target: str) -> None:
    users = [args.strip() for op, args in chain(target) if op == "USER"]
    assert users, f"{target} sets no USER"
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]


def test_the_spark_image() -> None:
    spark = BY_NAME["spark"]
    steps = chain("spark")
    # Debian bookworm has openjdk-17 (trixie, the plain slim tag's base now, has not).
    assert spark.base in BY_NAME or "bookworm" in spark.base, spark.base
    # What the image's own steps install, and what the stages it copies from install.
    sources = [copy_from(args) for op, args in steps if op == "COPY"]
    runs = " ".join([args for op, args in steps if op == "RUN"]
                    + [args for source in sources if source in BY_NAME
                       for op, args in chain(source) if op == "RUN"])
    # The image installs pyproject's [spark] extra, which pins pyspark and pyarrow and
    # holds what gazette_spark imports (numpy, pandas).
    assert '["optional-dependencies"]["spark"]' in runs, "the [spark] extra is not installed"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["spark"]
    assert any(re.fullmatch(r"pyspark==\d+\.\d+\.\d+", r) for r in extra), extra
    assert any(re.fullmatch(r"pyarrow==\d+\.\d+\.\d+", r) for r in extra), extra
    assert {"numpy", "pandas"} <= {re.split(r"[<>=!~\[]", r)[0] for r in extra}, extra
    assert "openjdk-17-jre-headless" in runs
    envs = " ".join(args for op, args in steps if op == "ENV")
    assert re.search(r"\bJAVA_HOME=/usr/lib/jvm/\S*17", envs), envs
    # Spark binds to the pod's own address unless a job says otherwise.
    assert all("SPARK_LOCAL_IP" not in args for stage in STAGES
               for op, args in stage.instructions if op in ("ENV", "ARG"))


@pytest.mark.parametrize("target", TARGETS)
def test_the_entrypoint_runs(target: str) -> None:
    entries = [args for op, args in chain(target) if op == "ENTRYPOINT"]
    assert entries, f"{target} has no ENTRYPOINT"
    argv = json.loads(entries[-1])
    if argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    elif argv[0] == "gazette":
        argv = [sys.executable, "-m", "gazette_dev.cli", *argv[1:]]
    # --help proves the command and its imports resolve, without serving anything (the
    # operator, broker and consumer entrypoints all parse their arguments first).
    argv.append("--help")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout.lower(), proc.stdout[-2000:]
