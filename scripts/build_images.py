#!/usr/bin/env python3
"""Build the Gazette images with the tags the chart pulls (``make images``).

One tag scheme everywhere: ``[REGISTRY/]gazette-<target>:<TAG>``, TAG being the chart's
``appVersion`` unless given. The chart's ``image.registry`` and ``image.tag`` take the same
two values, so what this builds is what ``helm install`` pulls.

The builder is ``docker`` when its daemon answers, else ``podman`` (``--isolation chroot``:
no OCI runtime or daemon needed). The base is ``python:3.11-slim-bookworm``; where no
registry is reachable and the base is not already present, a Debian bookworm base with
Python 3.11 is made with ``debootstrap`` (as root) and imported as
``localhost/gazette-python:3.11-bookworm``. A build behind a TLS-inspecting proxy gets the
machine's CA bundle as the secret ``pip-cert`` (``--pip-cert``, default ``$PIP_CERT`` or
Debian's bundle when present).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("broker", "operator", "consumer", "spark")
UPSTREAM_BASE = "python:3.11-slim-bookworm"
LOCAL_BASE = "localhost/gazette-python:3.11-bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_CA = "/etc/ssl/certs/ca-certificates.crt"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = re.compile(rf"{_COMPONENT}(?::[0-9]+)?(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class BuildError(Exception):
    """A build step failed; the message says which and why."""


def app_version() -> str:
    """The chart's appVersion: the default tag of every image."""
    text = (ROOT / "charts/gazette/Chart.yaml").read_text()
    match = re.search(r'^appVersion:\s*"?([^"\s]+)"?\s*$', text, re.MULTILINE)
    if match is None:
        raise BuildError("charts/gazette/Chart.yaml has no appVersion")
    return match.group(1)


def image_name(target: str, registry: str = "", tag: str = "") -> str:
    """``[registry/]gazette-<target>:<tag>``: the reference the chart renders."""
    repository = f"gazette-{target}"
    if registry:
        repository = f"{registry.rstrip('/')}/{repository}"
    return f"{repository}:{tag or app_version()}"


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.run(argv, text=True, check=False, **kwargs)  # type: ignore[call-overload]


def pick_builder(requested: str) -> str:
    if requested != "auto":
        if shutil.which(requested) is None:
            raise BuildError(f"--builder {requested}: not on PATH")
        return requested
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, check=False,
                                 timeout=30).returncode == 0:
        return "docker"
    if shutil.which("podman"):
        return "podman"
    raise BuildError("no image builder: install podman (apt-get install podman) or run a "
                     "Docker daemon")


def image_exists(builder: str, ref: str) -> bool:
    argv = ([builder, "image", "exists", ref] if builder == "podman"
            else [builder, "image", "inspect", ref])
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def debootstrap_base(builder: str, ref: str) -> None:
    """A Debian bookworm minbase with python3, venv and pip, imported as ``ref``."""
    if shutil.which("debootstrap") is None:
        raise BuildError(f"{UPSTREAM_BASE} cannot be pulled and debootstrap is missing: "
                         "apt-get install debootstrap, or pass --python-image")
    if os.geteuid() != 0:
        raise BuildError(f"{UPSTREAM_BASE} cannot be pulled, and debootstrap needs root to "
                         "make a base: run as root, or pass --python-image")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gazette-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = run(["debootstrap", "--variant=minbase",
                    "--include=python3,python3-venv,python3-pip,ca-certificates",
                    "bookworm", str(rootfs), DEBIAN_MIRROR], capture_output=True)
        if proc.returncode != 0:
            raise BuildError(f"debootstrap failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        # apt's lists and debootstrap's downloads are not part of the image.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        proc = run([builder, "import", "--change", "CMD [\"python3\"]", "-", ref],
                   stdin=tar.stdout, capture_output=True)
        tar.wait()
        if proc.returncode != 0 or tar.returncode != 0:
            raise BuildError(f"{builder} import failed: {proc.stderr[-3000:]}")
    print(f"base {ref} made with debootstrap in {time.monotonic() - started:.0f} s",
          file=sys.stderr)


def python_base(builder: str, requested: str) -> str:
    if requested:
        return requested
    if image_exists(builder, UPSTREAM_BASE) or image_exists(builder, LOCAL_BASE):
        return UPSTREAM_BASE if image_exists(builder, UPSTREAM_BASE) else LOCAL_BASE
    if run([builder, "pull", UPSTREAM_BASE], capture_output=True).returncode == 0:
        return UPSTREAM_BASE
    print(f"{UPSTREAM_BASE} cannot be pulled here: making a Debian base", file=sys.stderr)
    debootstrap_base(builder, LOCAL_BASE)
    return LOCAL_BASE


def build(builder: str, target: str, ref: str, base: str, pip_cert: str) -> float:
    argv = [builder, "build", "--target", target, "--tag", ref,
            "--build-arg", f"PYTHON_IMAGE={base}", "--file", str(ROOT / "Dockerfile")]
    if builder == "podman":
        argv += ["--isolation", "chroot", "--layers"]
    if pip_cert:
        argv += ["--secret", f"id=pip-cert,src={pip_cert}"]
    env = dict(os.environ)
    if builder == "docker":
        env.setdefault("DOCKER_BUILDKIT", "1")  # cache and secret mounts
    started = time.monotonic()
    proc = run([*argv, str(ROOT)], env=env)
    if proc.returncode != 0:
        raise BuildError(f"building {ref} (target {target}) failed: see the output above")
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", default=list(TARGETS),
                        help=f"what to build (default: all of {', '.join(TARGETS)})")
    parser.add_argument("--registry", default=os.environ.get("REGISTRY", ""),
                        help="prefix of every repository, as the chart's image.registry")
    parser.add_argument("--tag", default=os.environ.get("TAG", ""),
                        help="the images' tag (default: the chart's appVersion)")
    parser.add_argument("--builder", choices=("auto", "docker", "podman"), default="auto")
    parser.add_argument("--python-image", default=os.environ.get("PYTHON_IMAGE", ""),
                        help=f"the base (default: {UPSTREAM_BASE}, else a debootstrap one)")
    parser.add_argument("--pip-cert", default=os.environ.get("PIP_CERT", "")
                        or (DEBIAN_CA if Path(DEBIAN_CA).is_file() else ""),
                        help="a CA bundle for pip inside the build (empty: none)")
    parser.add_argument("--push", action="store_true", help="push each image once built")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the images it would build (and push), and build nothing")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)}: choose from {', '.join(TARGETS)}")
    if args.pip_cert and not Path(args.pip_cert).is_file():
        parser.error(f"--pip-cert {args.pip_cert}: no such file")
    if args.registry and not _REGISTRY.fullmatch(args.registry.rstrip("/")):
        parser.error(f"REGISTRY={args.registry!r} is not a registry and path (e.g. "
                     "ghcr.io/acme or localhost:5000/team: lower case, no spaces)")
    if args.tag and not _TAG.fullmatch(args.tag):
        parser.error(f"TAG={args.tag!r} is not an image tag (letters, digits, '_', '.', '-'; "
                     "at most 128, not starting with '.' or '-')")
    if args.dry_run:
        for target in args.targets:
            ref = image_name(target, args.registry, args.tag)
            print(f"would build {ref} (target {target})" + (", then push it" if args.push
                                                              else ""))
        return 0
    try:
        builder = pick_builder(args.builder)
        base = python_base(builder, args.python_image)
        timings = {}
        for target in args.targets:
            ref = image_name(target, args.registry, args.tag)
            timings[ref] = build(builder, target, ref, base, args.pip_cert)
            if args.push and run([builder, "push", ref]).returncode != 0:
                raise BuildError(f"pushing {ref} failed")
    except BuildError as exc:
        print(f"make images: {exc}", file=sys.stderr)
        return 1
    for ref, seconds in timings.items():
        print(f"built {ref} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
