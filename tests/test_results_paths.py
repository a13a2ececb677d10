"""Committed results and newly written records name no absolute path of the machine that made
them (`grammarrl.runs.paths`, `experiments.relativize_paths`)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path

from omegaconf import DictConfig

from experiments.relativize_paths import machine_rules
from grammarrl.runs import rundir
from grammarrl.runs.logs import portable_log_files
from grammarrl.runs.paths import relativize
from grammarrl.runs.results import build_results, untested_results, write_results
from tests.conftest import REPO, compose_config

RESULTS = ("experiments/results", "benchmarks/results")
# an absolute path under these folders of the machines that ran the studies (not a URL's path)
ABSOLUTE = re.compile(r"(?<![\w.~/<>-])/(?:work|tmp|root|home)/")


def test_committed_results_hold_no_absolute_path():
    """Every tracked text file under the results folders; failures name the file and line."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", *RESULTS], cwd=REPO, capture_output=True, check=True, text=True
    )
    found = []
    for name in filter(None, listed.stdout.split("\0")):
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:  # images
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            found += [
                f"{name}:{number}: {line[m.start() : m.end() + 60]}"
                for m in ABSOLUTE.finditer(line)
            ]
    assert not found, "absolute paths (python -m experiments.relativize_paths):\n" + "\n".join(
        found[:20]
    )


SAMPLE = """\
{"set": 0, "uid": "/work/shared/data/conll2003/test.txt:17", "input": "Paris"}
"set_ids": [["/work/shared/data/wos/wos_labelled.jsonl:3"]],
"data": {"dir": "/work/shared/data"}, "cache_dir": "/root/.cache/grammarrl",
"adapter": "/work/ev8/multirun/evidence2/train/0_lambda=0.5/adapter",
"resume": "/work/run320/checkpoints/last.ckpt", "calibration_file": "/tmp/cal.json",
"eval.adapter": "/work/adapters/adapter-seed1",
cache_dir: ${oc.env:GRAMMARRL_CACHE_DIR,${oc.env:HOME,/tmp}/.cache/grammarrl}
  runtime:
    cwd: /work/ev11
    - path: /work/ev11/conf
    output_dir: /work/ev11/multirun/evidence2/proposal/1_particles=4
[2026-01-01 10:00:00,000][grammarrl.data.sources][WARNING] - conll: \
/work/shared/data/conll2003/valid.txt:9: row skipped (empty)
see https://example.org/work/page
"""
EXPECTED = """\
{"set": 0, "uid": "conll2003/test.txt:17", "input": "Paris"}
"set_ids": [["wos/wos_labelled.jsonl:3"]],
"data": {"dir": "<data>"}, "cache_dir": "<cache>",
"adapter": "multirun/evidence2/train/0_lambda=0.5/adapter",
"resume": "<work>/run320/checkpoints/last.ckpt", "calibration_file": "<tmp>/cal.json",
"eval.adapter": "<work>/adapters/adapter-seed1",
cache_dir: ${oc.env:GRAMMARRL_CACHE_DIR,${oc.env:HOME,/tmp}/.cache/grammarrl}
  runtime:
    cwd: .
    - path: conf
    output_dir: multirun/evidence2/proposal/1_particles=4
[2026-01-01 10:00:00,000][grammarrl.data.sources][WARNING] - conll: \
<data>/conll2003/valid.txt:9: row skipped (empty)
see https://example.org/work/page
"""


def test_the_rewrite_relativizes_ids_records_and_hydra_files_once(monkeypatch):
    """Example ids as the tasks write them now (relative to the data directory), the data
    directory and cache as tokens, checkouts left out; a second run changes nothing."""
    monkeypatch.delenv("GRAMMARRL_DATA_DIR", raising=False)
    monkeypatch.delenv("GRAMMARRL_CACHE_DIR", raising=False)
    text, counts = relativize(SAMPLE, machine_rules())
    assert text == EXPECTED
    assert counts == {"data_id": 2, "data": 2, "cache": 1, "repo": 4, "tmp": 1, "work": 2}
    assert relativize(text, machine_rules()) == (text, {})


def _job(tmp_path: Path, monkeypatch) -> tuple[DictConfig, Path]:
    """A job started in tmp_path (the repository) with its data and cache there too, and its
    run directory holding Hydra's files as Hydra writes them (absolute)."""
    monkeypatch.chdir(tmp_path)
    data, cache = tmp_path / "shared" / "data", tmp_path / "home" / "cache" / "grammarrl"
    cfg = compose_config(
        ["model=tiny", "mode=eval", "logger=none", f"data.dir={data}", f"cache_dir={cache}"]
        + [f"eval.adapter={tmp_path / 'ad'}"]
    )
    out = tmp_path / "multirun" / "0"
    (out / ".hydra").mkdir(parents=True)
    (out / ".hydra" / "hydra.yaml").write_text(f"cwd: {tmp_path}\noutput_dir: {out}\n")
    return cfg, out


def test_new_records_hold_no_absolute_path(tmp_path, monkeypatch):
    """job.json and results.json name the data, cache and run directory relatively; the record
    reads back with this machine's directories, and the same job in the directory is skipped."""
    cfg, out = _job(tmp_path, monkeypatch)
    monkeypatch.setenv("GRAMMARRL_DATA_DIR", cfg.data.dir)
    monkeypatch.setenv("GRAMMARRL_CACHE_DIR", cfg.cache_dir)
    rundir.commit(cfg, out, rundir.Plan())
    results = build_results(
        task="conll",
        model="tiny",
        decoding="greedy",
        metric="micro_f1",
        scores=[0.5],
        validity=1.0,
        truncated=0.0,
        examples_per_second=1.0,
        config=cfg,
        adapter=str(out / "adapter"),
    )
    write_results(out, results, [])
    untested = untested_results(task="conll", model="tiny", config=cfg)
    for text in (*(p.read_text() for p in out.glob("*.json")), json.dumps(untested)):
        assert str(tmp_path) not in text
    record = json.loads((out / "job.json").read_text())
    assert (record["config"]["data"]["dir"], record["config"]["cache_dir"]) == ("<data>", "<cache>")
    assert record["hydra_files"]["hydra.yaml"] == "cwd: .\noutput_dir: multirun/0\n"
    read = rundir.read_record(out)["config"]
    assert (read["data"]["dir"], read["cache_dir"]) == (cfg.data.dir, cfg.cache_dir)
    assert rundir.plan_job(cfg, out).done["mean"] == 0.5


def test_the_log_file_names_paths_relatively(tmp_path, monkeypatch):
    """The job's log file (a root file handler) writes the working directory's paths
    relative to it; the message itself is left as it was."""
    monkeypatch.chdir(tmp_path)
    handler = logging.FileHandler(tmp_path / "run.log")
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        portable_log_files()
        record = logging.LogRecord("x", logging.INFO, "", 0, "wrote %s", (tmp_path / "a",), None)
        root.handle(record)
    finally:
        root.removeHandler(handler)
        handler.close()
    assert (tmp_path / "run.log").read_text() == "wrote a\n"
    assert record.getMessage() == f"wrote {tmp_path / 'a'}"


def test_a_saved_adapter_names_its_base_model_under_the_cache(model, tmp_path, monkeypatch):
    """PEFT records the base model's directory in adapter_config.json: written as `<cache>/...`
    (it was this machine's absolute path), and the adapter loads back."""
    from peft import PeftModel

    from grammarrl.models.loading import add_lora
    from grammarrl.training.policy import save_adapter

    cache = tmp_path / "cache"
    monkeypatch.setenv("GRAMMARRL_CACHE_DIR", str(cache))
    policy = add_lora(model, compose_config(["model=tiny"]).lora)
    policy.peft_config["default"].base_model_name_or_path = str(cache / "models" / "tiny")
    try:
        save_adapter(policy, tmp_path / "adapter")
    finally:
        policy.unload()
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "<cache>/models/tiny"
    loaded = PeftModel.from_pretrained(model, tmp_path / "adapter")
    assert loaded.peft_config["default"].r == config["r"]
    loaded.unload()
