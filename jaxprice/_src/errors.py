"""The one exception type jaxprice raises for bad input, before anything is jitted."""

from __future__ import annotations


class JaxpriceError(ValueError):
    """Bad input: names the file, the field and the offending value.

    Raised only from code that runs before jit (loading, resolving, building a batch),
    so a user never sees a traceback from inside a traced function.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 value: object = None, has_value: bool = False):
        self.file = file
        self.field = field
        self.value = value
        where = []
        if file:
            where.append(str(file))
        if field:
            where.append(f"field '{field}'")
        if has_value or value is not None:
            where.append(f"value {value!r}")
        prefix = ": ".join([", ".join(where)]) if where else ""
        text = f"{prefix}: {message}" if prefix else message
        # one line, whatever a file name or a quoted text holds ('a\nb.yaml' printed two lines)
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))
        self.reason = message


def refuse(message: str, *, file=None, field=None, value=None, has_value=False):
    raise JaxpriceError(message, file=file, field=field, value=value, has_value=has_value)


def shown(value):
    """A wrong argument as a refusal shows it: None, numbers, text and bytes as they are, anything
    else by its type's name (a Deployment is not printed whole)."""
    return value if value is None or isinstance(value, (int, float, str, bytes)) else type(value).__name__


def check_callback(f, field: str = "callback", what: str = "a function callback(done, total, **info)") -> None:
    """Refuse a callback that cannot be called (it failed only after the work was done)."""
    if f is not None and not callable(f):
        refuse(f"must be None or {what}", field=field, value=type(f).__name__)
