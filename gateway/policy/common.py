"""What every policy section shares: unknown keys refused, range checks."""

from pydantic import (
    BaseModel,
    ConfigDict,
)


class StrictModel(BaseModel):
    # Unknown keys are typos more often than not: refuse them instead of ignoring them.
    model_config = ConfigDict(extra="forbid")


def between_0_and_1(value: float | None) -> float | None:
    if value is not None and not 0 <= value <= 1:
        raise ValueError("must be between 0 and 1")
    return value


def positive(value: float | int | None) -> float | int | None:
    if value is not None and value <= 0:
        raise ValueError("must be greater than 0")
    return value


def not_negative(value: float | int | None) -> float | int | None:
    if value is not None and value < 0:
        raise ValueError("must be 0 or greater")
    return value
