class ServerError(Exception):
    """Base of the errors the server services raise; the message is meant for the person who acted."""


class ServerRemoved(ServerError):
    """The server was removed: it cannot be changed, discovered or used any more."""


class ServerConfigInvalid(ServerError):
    def __init__(self, messages: dict[str, list[str]]):
        self.messages = messages
        text = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in messages.items())
        super().__init__(f"The server settings are not valid: {text}")
