"""Labelled example prompts for the difficulty classifier: read, checked, located.

A policy lists JSONL files (each line {prompt, label} or {prompt, score}) and/or inline
examples. Files are read when the policy loads, so a bad file is a policy error naming the
file and line, before anything trains or serves.
"""

import json
from pathlib import Path

from pydantic import ValidationError

from gateway.policy.schema import Policy, PolicyError, PolicyIssue
from gateway.policy.tiers import ExamplePrompt


class ExampleFileError(ValueError):
    pass


def read_example_file(path: Path) -> list[ExamplePrompt]:
    """Every line an ExamplePrompt; raises ExampleFileError naming the file and line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ExampleFileError(f"{path}: cannot read: {exc.strerror}") from None
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            examples.append(ExamplePrompt.model_validate(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ExampleFileError(f"{path}:{number}: invalid JSON: {exc.msg}") from None
        except ValidationError as exc:
            reason = "; ".join(_describe(e) for e in exc.errors())
            raise ExampleFileError(f"{path}:{number}: {reason}") from None
    if not examples:
        raise ExampleFileError(f"{path}: no examples")
    return examples


def _describe(error: dict) -> str:
    message = error["msg"].removeprefix("Value error, ")
    where = ".".join(map(str, error["loc"]))
    return f"{where}: {message}" if where else message


def resolve_example_files(policy: Policy, policy_path: Path) -> Policy:
    """Example paths made absolute (relative ones are read beside the policy file) and
    each file checked; a bad one is a PolicyError at its `difficulty.examples[i]` entry
    (the loader adds the line)."""
    resolved, issues = [], []
    for i, entry in enumerate(policy.difficulty.examples):
        if isinstance(entry, ExamplePrompt):
            resolved.append(entry)
            continue
        file = Path(entry)
        file = file if file.is_absolute() else policy_path.parent / file
        try:
            read_example_file(file)
        except ExampleFileError as exc:
            issues.append(PolicyIssue(f"difficulty.examples[{i}]", str(exc)))
        resolved.append(str(file))
    if issues:
        raise PolicyError(str(policy_path), issues)
    difficulty = policy.difficulty.model_copy(update={"examples": resolved})
    return policy.model_copy(update={"difficulty": difficulty})


def policy_examples(policy: Policy) -> list[ExamplePrompt]:
    """All of a loaded policy's examples, files read in order."""
    out: list[ExamplePrompt] = []
    for entry in policy.difficulty.examples:
        out += [entry] if isinstance(entry, ExamplePrompt) else read_example_file(Path(entry))
    return out
