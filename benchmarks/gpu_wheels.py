"""What a GPU session (benchmarks/gpu.py) installs, from a folder of wheels brought along, on a bare GPU
machine that has no network: `install_wheels` there, `fetch_wheels` here, before, and `missing`, why a part
cannot run. The standard library only: Keras may not be installed yet."""

import glob
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys

# module -> distribution, for what a part needs; WHEELS: what --fetch-wheels brings for a bare GPU machine
DISTRIBUTIONS = {"keras": "keras", "jax": "jax", "torch": "torch", "tensorflow": "tensorflow", "keras_hub": "keras-hub",
                 "timm": "timm"}
WHEELS = ("keras", "namex", "optree", "keras-hub", "kagglehub", "kagglesdk")


def installed(dist):
    """The installed version of the distribution `dist`, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_wheels(folder, site):
    """Installs into `site` each wheel of `folder` whose distribution is not installed here (pip, no
    index, no dependencies: the folder brings them), and puts `site` on this process's path.
    Returns one line per wheel."""
    if not folder or not os.path.isdir(folder):
        return [f"no wheels folder {folder!r}: nothing installed"]
    os.makedirs(site, exist_ok=True)
    sys.path.insert(0, site)
    importlib.invalidate_caches()
    lines = []
    for path in sorted(glob.glob(os.path.join(folder, "*.whl"))):
        name, version = os.path.basename(path).split("-")[:2]
        name = re.sub(r"[-_.]+", "-", name).lower()
        have = installed(name)
        if have:
            lines.append(f"kept {name} {have} (already here; the folder's {version} not used)")
            continue
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                               "--no-compile", "--disable-pip-version-check", "--upgrade", "--target", site, path],
                              capture_output=True, text=True)
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        done = f"installed {name} {version}"
        lines.append(f"not {done}: {last[:200]}" if proc.returncode else done)
        importlib.invalidate_caches()
    return lines


def fetch_wheels(folder, python_version):
    """Downloads WHEELS for a Linux x86-64 CPython `python_version` machine into `folder`, at the
    versions installed here where they are (what the tests ran); one line per wheel."""
    os.makedirs(folder, exist_ok=True)
    tags = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    lines = []
    for dist in WHEELS:
        version = installed(dist)
        pin = f"{dist}=={version}" if version else dist
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "--python-version", python_version, "--implementation",
                               "cp", *[a for t in tags for a in ("--platform", t)], "-d", folder, pin],
                              capture_output=True, text=True)
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        lines.append(f"not fetched {pin}: {last[:200]}" if proc.returncode else f"fetched {pin}")
    return lines


def missing(modules, wheels):
    """Why a part needing `modules` cannot run here, or None."""
    absent = [DISTRIBUTIONS[m] for m in modules if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    where = ""
    if wheels and os.path.isdir(wheels):
        where = f" and {wheels} holds no wheel for {'it' if len(absent) == 1 else 'them'}"
    return f"{', '.join(absent)} not installed{where}"
