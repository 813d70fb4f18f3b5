"""The `batch` section: how the Batch API (/v1/files, /v1/batches) runs its lines."""

from pydantic import field_validator

from gateway.policy.common import StrictModel, not_negative, positive


class BatchSettings(StrictModel):
    """Batch lines go through the chat pipeline at the engines' batch priority; see
    docs/policies.md, "Batches"."""

    # What a batch line's tokens cost, as a share of the tier's price (OpenAI's is half).
    price_factor: float = 0.5
    # Lines in flight at once per gateway, over every batch: on remote tiers the rest of
    # their slots stay for interactive traffic (local engines also schedule batch work last).
    max_concurrent: int = 4
    max_file_mb: float = 100.0  # largest input file /v1/files accepts
    # A line refused by a limit (429) or a failing tier (5xx) is tried again this often
    # before it goes to the error file.
    line_attempts: int = 3

    _check_factor = field_validator("price_factor")(not_negative)
    _check_positive = field_validator("max_concurrent", "max_file_mb", "line_attempts")(positive)
