"""Judge a recorded diagnosis again, without a model (docs/diagnose.md):

    python -m experiments.rejudge RUN_DIR [--out DIR] [OVERRIDES ...]

Composes the run's own overrides (RUN_DIR/.hydra/overrides.yaml) followed by OVERRIDES (for
example `diagnose.blind_below=0.5` or `diagnose.lambdas=[0,0.5,1]`; not what was decoded:
`seed`, `diagnose.num_inputs`, `diagnose.num_samples`, `diagnose.num_labelled`) and writes
`diagnosis.json`, `.md` and `.png` again into DIR (default: RUN_DIR) under this version's rules
(`grammarrl.diagnosis.rejudge`); `rejudged` in the new record names the overrides.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grammarrl.diagnosis.rejudge import check_overrides, recorded_overrides, rejudge
from grammarrl.errors import ConfigError
from grammarrl.job import compose_job_config, validate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a mode=diagnose run directory")
    parser.add_argument("--out", type=Path, help="where to write (default: the run directory)")
    parser.add_argument("overrides", nargs="*", help="e.g. diagnose.blind_below=0.5")
    args = parser.parse_intermixed_args(argv)
    out = args.out or args.run
    try:
        check_overrides(args.overrides)
        cfg = compose_job_config([*recorded_overrides(args.run), *args.overrides])
        validate(cfg)
        record = rejudge(args.run, out, cfg, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{record['verdict']['text']}\n-> {out / 'diagnosis.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
