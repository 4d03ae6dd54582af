"""A stand-in dependency for the migration guides: it fails, then answers."""


class Flaky:
    """Fails with ``ConnectionError`` ``failures`` times, then answers ``answer``; counts calls."""

    def __init__(self, failures: int = 2, answer: object = "ok") -> None:
        self.failures, self.answer, self.calls = failures, answer, 0

    def __call__(self, *args: object) -> object:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"attempt {self.calls} failed")
        return self.answer
