"""Which exception a bad argument raises: a ``TypeError`` when its type is
wrong (an int expected, a bool, a tensor, a float dtype ...), a
``ValueError`` when its value is (a size below 1, a shape that does not
fit). Parametrized bad-input tests list the message; this picks the type
from what the message says was expected."""
import re

TYPE_WORDS = re.compile(
    r"must be (an int\b|an int64 tensor|an integer tensor|a real number"
    r"|a bool\b|a bool tensor|a torch\.|floating point|a floating|"
    r"callable|an nn\.Module|a \w*Config\b|a RotaryEmbedding|a KVCache)")


def error_for(message: str) -> type[Exception]:
    """TypeError if ``message`` says a type was expected, else ValueError."""
    return TypeError if TYPE_WORDS.search(message) else ValueError


def whole_message(text: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly ``text``, taken
    literally (its brackets and dots are not regex syntax)."""
    return "^" + re.escape(text) + "$"
