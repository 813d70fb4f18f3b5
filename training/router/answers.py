"""Both local tiers' answers to the router's checkable tasks, one or several per task.

Answer 0 of each task is greedy; answers 1.. are sampled at a temperature with a seed fixed
by (task id, answer index), so a rerun (or a run resumed after a kill) draws the same
samples. Each finished answer is appended to the tier's answer file at once; a later run
reads the file and generates only the (task, answer) pairs it lacks (an answer recorded
for another prompt under the same task id counts as lacking).
"""

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from training.router.tasks import Task

TIERS = {"small": "smollm2-135m", "large": "qwen2.5-coder-0.5b"}


@dataclass(frozen=True)
class Sampling:
    samples: int = 1  # answers per task: the greedy one, then samples - 1 sampled ones
    temperature: float = 0.7
    weights: str = "fp32"  # the engine's weight format (EngineConfig.weights)


def answer_seed(task_id: str, index: int) -> int:
    return int(hashlib.sha256(f"{task_id}/{index}".encode()).hexdigest()[:8], 16)


def answer_params(task: Task, index: int, temperature: float) -> SamplingParams:
    if index == 0:
        return SamplingParams(temperature=0.0, max_tokens=task.max_tokens)
    seed = answer_seed(task.id, index)
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=task.max_tokens)


def prompt_digest(task: Task) -> str:
    return hashlib.sha256(f"{task.system}\n{task.prompt}".encode()).hexdigest()[:12]


def read_answers(path: Path, tasks: list[Task]) -> dict[tuple[str, int], dict]:
    """(task id, answer index) -> answer, for answers to these tasks' current prompts (rows
    from before digests were kept count as current); a torn line (a killed run) is skipped."""
    if not path.exists():
        return {}
    digests = {t.id: prompt_digest(t) for t in tasks}
    out = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("prompt_sha", digests.get(row["id"])) == digests.get(row["id"]):
            out[(row["id"], row.get("sample", 0))] = row
    return out


def tier_answers(
    tier: str, tasks: list[Task], sampling: Sampling, path: Path
) -> dict[tuple[str, int], dict]:
    """Every task's `sampling.samples` answers from this tier, generating only the missing."""
    kept = read_answers(path, tasks)
    wanted = [(t, i) for t in tasks for i in range(sampling.samples) if (t.id, i) not in kept]
    if wanted:
        start = time.process_time()
        with path.open("a") as sink:
            _generate(TIERS[tier], wanted, sampling, kept, sink)
        seconds = time.process_time() - start
        print(f"{tier}: {seconds:.0f} s CPU for {len(wanted)} answers", flush=True)
    return kept


def _generate(
    model: str, wanted: list[tuple[Task, int]], sampling: Sampling, kept: dict, sink
) -> None:
    """Batched through one engine on one thread; answers of one task share its prompt pages."""
    engine = LLMEngine(
        EngineConfig(
            model=model,
            num_threads=1,
            max_num_seqs=64,
            max_waiting=len(wanted) + 1,
            weights=sampling.weights,
        )
    )
    template = engine.tokenizer.apply_chat_template
    digests = {task.id: prompt_digest(task) for task, _ in wanted}
    for task, index in wanted:
        messages = [
            {"role": "system", "content": task.system},
            {"role": "user", "content": task.prompt},
        ]
        params = answer_params(task, index, sampling.temperature)
        engine.add_request(f"{task.id}/{index}", template(messages), params)
    texts: dict[str, list[str]] = {}
    done = 0
    while engine.has_unfinished():
        for out in engine.step():
            texts.setdefault(out.request_id, []).append(out.text)
            if not out.finished:
                continue
            task_id, index = out.request_id.rsplit("/", 1)
            row = {
                "id": task_id,
                "sample": int(index),
                "prompt_sha": digests[task_id],
                "text": "".join(texts.pop(out.request_id)),
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": out.completion_tokens,
            }
            kept[(task_id, int(index))] = row
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            done += 1
            if done % 500 == 0:
                print(f"{model}: {done}/{len(wanted)} answers", flush=True)
