"""How much of the prior `router learn --prior auto` keeps: cross-validated on the training
slice, the most prior within one standard error of the best; all of it when there are too
few labels to choose."""

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.cache.samples import Sample
from gateway.embedding.embedder import Embedder
from gateway.policy import load_policy
from tests.router_examples import EASY, HARD
from tests.router_examples import examples as prior
from training.router.learn_fit import Labelled
from training.router.learn_prior import KEEPS, auc_standard_error, choose_prior_keep

POLICY = """
auth: {mode: none}
tiers:
  small: {deployments: [{model: openai/none, api_base: 'http://127.0.0.1:9/v1'}]}
  large: {deployments: [{model: openai/none, api_base: 'http://127.0.0.1:9/v1'}]}
difficulty: {examples: [examples.jsonl], blend: {classifier: 1.0}}  # one linear model: votes add up
routes:
  auto: {rules: [{tier: large, min_score: 0.5}], default: small}
"""


@pytest.fixture(scope="module")
def embed():
    return Embedder().embed_many


def policy_in(folder: Path, copies: int = 1):
    """The small examples set, `copies` times: 20 make a prior of 1,280 that outvotes 40
    traffic samples, as the shipped 4,472 outvote a few hundred."""
    rows = prior() * copies
    (folder / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "policy.yaml").write_text(POLICY)
    return load_policy(folder / "policy.yaml")


def labelled(i: int, text: str, needs_large: int) -> Labelled:
    messages = [{"role": "user", "content": text}]
    return Labelled(Sample("t", "auto", messages, "small", "m", "a", id=f"id{i}"), needs_large)


def contrary_traffic(count: int) -> list[Labelled]:
    """Tiers whose large model helps on the prior's easy prompts and not on its hard ones
    (new numbers in the prior's own phrasings): the opposite of what the prior says."""
    rows = []
    for i in range(count):
        template = (HARD if i % 2 else EASY)[i % 3 % (2 if i % 2 else 3)]
        rows.append(labelled(i, template.format(100 + i, 200 + i), 0 if i % 2 else 1))
    return rows


def test_traffic_that_contradicts_the_prior_drops_it(tmp_path: Path, embed) -> None:
    choice = choose_prior_keep(policy_in(tmp_path, 20), contrary_traffic(40), 1, embed)
    assert set(choice.cv_auc) == {"all" if k is None else str(k) for k in KEEPS}
    assert choice.keep is not None  # not every prior example: they outvote the traffic
    assert choice.cv_auc[str(choice.keep)] > choice.cv_auc["all"]
    assert choice.scores is not None and len(choice.scores) == 40


def test_too_few_labels_keep_the_whole_prior(tmp_path: Path, embed) -> None:
    choice = choose_prior_keep(policy_in(tmp_path), contrary_traffic(12), 1, embed)
    assert choice.keep is None and choice.scores is None and "fewer than" in choice.reason


def test_the_auc_standard_error_shrinks_with_more_samples() -> None:
    small, large = auc_standard_error(0.7, 20, 80), auc_standard_error(0.7, 200, 800)
    assert 0 < large < small < 0.1
    assert np.isclose(auc_standard_error(0.5, 50, 50), 0.0577, atol=0.002)
