class TaskError(Exception):
    """Base of the errors the task services raise; the message is meant for the person who acted."""


class InvalidTransition(TaskError):
    """The task is not in a state where this change makes sense."""


class TaskAlreadyFinished(InvalidTransition):
    pass


class AnswerRejected(TaskError):
    """The answer does not fit the request. `field_errors` maps each content field to what is wrong with it."""

    def __init__(self, message: str, field_errors: dict[str, str] | None = None):
        self.field_errors = field_errors or {}
        if self.field_errors:
            message = message + " " + "; ".join(f"{name}: {problem}" for name, problem in self.field_errors.items())
        super().__init__(message)


class PolicyRefused(AnswerRejected):
    """The answer fits the request, but its approval policy does not let this person give it (now)."""


class LaunchRefused(TaskError):
    """The call cannot be launched as asked. `field_errors` maps each argument ("" for all of them) to what is wrong."""

    def __init__(self, message: str, field_errors: dict[str, str] | None = None):
        self.field_errors = field_errors or {}
        if self.field_errors:
            problems = (f"{name}: {problem}" if name else problem for name, problem in self.field_errors.items())
            message = message + " " + "; ".join(problems)
        super().__init__(message)


class UnknownTool(LaunchRefused):
    """The server's discovered catalogue has no tool of that name."""


class ArgumentsRejected(LaunchRefused):
    """The launch arguments hold text Postgres cannot store (taskhub.tasks.storable_text): NUL, a lone surrogate."""


class AlreadyAnswered(TaskError):
    def __init__(self, *, key: str, answered_by: str, answered_at):
        self.answered_by = answered_by
        self.answered_at = answered_at
        super().__init__(
            f"The request {key!r} was already answered by {answered_by} at {answered_at:%Y-%m-%d %H:%M:%S %Z}; "
            "each request takes one answer."
        )


class InputNoLongerOpen(TaskError):
    """The request was withdrawn by the server (superseded) before this answer."""


class LeaseLost(Exception):
    """A worker asked to act on a stdio server's process whose lease it no longer holds (found in Postgres, in the
    statement that would have recorded the act): nothing was recorded or sent. Only stdio servers have leases."""

    def __init__(self, message: str, *, server_id: int) -> None:
        super().__init__(message)
        self.server_id = server_id
