"""List (and check) the jobs a sweep would launch, without running anything.

    python -m experiments.jobs +experiment=ablation_lambda [more overrides] [--cfg]

Hydra refuses `-m` together with `--cfg job`, so this expands the sweep the way Hydra's basic
sweeper does (the experiment's `hydra.sweeper.params`, then the command line's sweep
overrides, later ones winning), composes every job's config and validates it as
`grammarrl.run` would. It prints one line per job, `#i : overrides` like Hydra's launcher log,
and with `--cfg` each job's composed config.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the sweeper Hydra runs
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from grammarrl.config.checks import CONF_DIR
from grammarrl.job import compose_job_config, validate


def expand(overrides: Sequence[str]) -> list[list[str]]:
    """The override list of every job of `python -m grammarrl.run -m <overrides>`."""
    parser = OverridesParser.create()
    fixed = [
        o.input_line for o in parser.parse_overrides(list(overrides)) if not o.is_sweep_override()
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=fixed, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()] + list(overrides)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return [list(job) for batch in batches for job in batch]


def compose_job(overrides: Sequence[str]) -> DictConfig:
    """One job's config (without Hydra's own section), as the job would see it."""
    return compose_job_config(list(overrides))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.jobs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("overrides", nargs="*", help="as for python -m grammarrl.run -m")
    parser.add_argument("--cfg", action="store_true", help="print every job's config")
    args = parser.parse_args(argv)
    jobs = expand(args.overrides)
    for index, job in enumerate(jobs):
        cfg = compose_job(job)
        validate(cfg)
        print(f"#{index} : {' '.join(job)}")
        if args.cfg:
            print(OmegaConf.to_yaml(cfg))
    print(f"{len(jobs)} jobs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
