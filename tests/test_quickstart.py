"""What `make run` runs: conf/experiment/quickstart.yaml on the support-ticket triage example
(examples/support_tickets/triage.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

from grammarrl.job import validate
from grammarrl.tasks import load_task
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "support_tickets"


def test_quickstart_composes_the_triage_task_with_a_summary():
    cfg = compose_config(["+experiment=quickstart"])
    validate(cfg)
    assert cfg.task.name == "support_triage" and cfg.task.spec.endswith(
        "support_tickets/triage.yaml"
    )
    assert cfg.model.name == "smollm2" and cfg.mode == "train"
    # the summary compares frozen and trained, with the training reward of the greedy outputs
    assert cfg.train.eval_baseline and cfg.eval.score_rewards
    assert cfg.eval.num_test_sets >= 2


def test_triage_gold_is_the_tickets_category_and_order_number():
    """triage.yaml reads the same messages as task.yaml; its gold output (`triage`) is the
    ticket's category and order number, and the schema accepts every one."""
    cfg = compose_config(["model=tiny", "task=custom", f"task.spec={FOLDER / 'triage.yaml'}"])
    validate(cfg)
    task = load_task(cfg)
    s = task.splits()
    assert (task.name, task.metric_name) == ("support_triage", "json_fields_f1")
    assert (len(s.train), len(s.fewshot), len(s.test_pool)) == (240, 3, 60)
    assert task.gold_rejected[0] == 0
    rows = [json.loads(line) for line in (FOLDER / "test.jsonl").read_text().splitlines()]
    by_input = {ex.input: json.loads(ex.target) for ex in s.test_pool}
    for row in rows:
        assert by_input[row["message"]] == {
            "category": row["ticket"]["category"],
            "order_id": row["ticket"]["order_id"],
        }
