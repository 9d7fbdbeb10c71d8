"""The data pipeline's errors, and how a failure inside a worker reaches the main thread."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


class DataLoaderError(RuntimeError):
    """A batch could not be built (raised when the original exception type cannot carry the message)."""


class WorkerDiedError(DataLoaderError):
    """A worker process exited while the loader still needed it."""


@dataclass
class BatchBuildError(Exception):
    """What went wrong while building one batch; picklable, so process workers send it back as is.

    ``stage`` is "dataset" (``dataset[index]`` raised), "collate" (the items do not stack: the
    message already names the index) or "collate_fn" (the user's collate_fn raised).
    """

    stage: str
    indices: list[int]
    index: int | None
    type_name: str
    message: str
    error: BaseException | None = None
    traceback: str = ""
    worker: str = "the main thread"
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return self.describe()

    def __reduce__(self) -> tuple:
        return (type(self), tuple(getattr(self, f.name) for f in fields(self)))

    def describe(self) -> str:
        if self.stage == "dataset":
            head = f"dataset[{self.index}] raised {self.type_name} in {self.worker}: "
        elif self.stage == "collate_fn":
            head = (
                f"collate_fn raised {self.type_name} in {self.worker} on the batch of dataset indices {self.indices}: "
            )
        else:
            head = ""
        text = head + self.message
        if self.traceback:
            text += f"\n\n{self.worker.capitalize()}'s traceback:\n{self.traceback}"
        return text

    def reraise(self) -> None:
        """Raise the original exception type with ``describe()`` as its message (the original as its cause)."""
        error = self.error
        kind = type(error) if error is not None else None
        text = self.describe()
        raised: BaseException
        if kind is not None:
            try:
                raised = kind(text)
            except Exception:
                raised = DataLoaderError(text)
        else:
            raised = DataLoaderError(text)
        raise raised from error
