"""The secrets compactd holds, kept out of every message it emits.

compactd holds a few secrets for the whole process: the password of the PostgreSQL store (in
whichever form libpq takes it), and the API key or token its summary provider uses. A message
can carry one back without compactd writing it: a database driver that quotes the connection
string it could not parse, an API gateway that echoes the key it refused. So each secret is
`hold`-ed where compactd learns it, and `scrub` takes every held secret out of a text: the
daemon scrubs every error, notification and log line it emits.

Secrets shorter than `MIN_LENGTH` are not scrubbed out of free text (they would match inside
ordinary words); where they stand in a connection string, `redact` removes them by position.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any
from urllib.parse import unquote

MIN_LENGTH = 4
SHOWN = "***"

_held: set[str] = set()
_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()


def hold(*values: str | None) -> None:
    """Secrets to keep out of every message from now on (None and empty ones are ignored)."""
    global _pattern
    fresh = {v for v in values if isinstance(v, str) and len(v) >= MIN_LENGTH} - _held
    if not fresh:
        return
    with _lock:
        _held.update(fresh)
        forms = {form for secret in _held for form in _forms(secret)}
        # longest first, so a secret that contains another is taken out whole
        ordered = sorted(forms, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(form) for form in ordered))


def _forms(secret: str) -> set[str]:
    """A secret as it may appear in a message: as is, percent-encoded in a URL, escaped in
    JSON or a libpq string."""
    from urllib.parse import quote

    return {
        secret,
        quote(secret, safe=""),
        secret.replace("\\", "\\\\").replace('"', '\\"'),
        secret.replace("\\", "\\\\").replace("'", "\\'"),
    }


def scrub(text: str) -> str:
    """`text` without any secret compactd holds."""
    pattern = _pattern
    if pattern is None or not text:
        return text
    return pattern.sub(SHOWN, text)


def scrub_data(value: Any) -> Any:
    """Every string inside a JSON value scrubbed (an error's `data`, a notification)."""
    if _pattern is None:
        return value
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [scrub_data(v) for v in value]
    if isinstance(value, dict):
        return {k: scrub_data(v) for k, v in value.items()}
    return value


class ScrubbedLog(logging.Filter):
    """A log handler's filter: the line (and its traceback) without any held secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _pattern is None:
            return True
        record.msg, record.args = scrub(record.getMessage()), None
        if record.exc_info:
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def scrub_logs() -> None:
    """Every handler of the root logger scrubs what it writes (a front calls this once its
    logging is set up)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(ScrubbedLog())


# ---- connection strings ------------------------------------------------------------------------

SECRET_KEYWORDS = ("password", "sslpassword")
"""The libpq connection parameters that hold a secret."""

_KEYWORD_VALUE = re.compile(
    r"(?P<key>\b(?:" + "|".join(SECRET_KEYWORDS) + r"))\s*=\s*"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|[^\s']*)",
    re.IGNORECASE,
)
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_QUERY_PARAM = re.compile(r"(?P<key>(?:^|[?&])(?P<name>[^=&#]*)=)(?P<value>[^&#]*)")


def connection_secrets(conninfo: str) -> list[str]:
    """The secrets in a libpq connection string, in every form libpq accepts: a URI's user
    part (`postgresql://user:secret@host`) and its `password=` / `sslpassword=` parameters
    (names and values percent-decoded), or a keyword/value string's (`host=… password=…`,
    quoted or not)."""
    found: list[str] = []
    head, sep, rest = conninfo.partition("://")
    if sep and _URI_SCHEME.fullmatch(head):  # any scheme: a mistyped one may hold one too
        authority, _, tail = rest.partition("/")
        if "@" in authority:
            auth = authority.rpartition("@")[0]
            if ":" in auth:
                found.append(unquote(auth.split(":", 1)[1]))
        query = tail.partition("?")[2] if "?" in tail else rest.partition("?")[2]
        for match in _QUERY_PARAM.finditer(query):
            if unquote(match["name"]).lower() in SECRET_KEYWORDS:
                found.append(unquote(match["value"]))
        return [f for f in found if f]
    for match in _KEYWORD_VALUE.finditer(conninfo):
        value = match["value"]
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1] if value.endswith("'") else value[1:])
        found.append(value)
    return [f for f in found if f]


def redact(conninfo: str) -> str:
    """A connection string to show: every secret in it replaced by `***`, by position (so a
    short one goes too), whatever form it is in."""
    head, sep, rest = conninfo.partition("://")
    if sep and _URI_SCHEME.fullmatch(head):
        authority, slash, tail = rest.partition("/")
        if "@" in authority:
            auth, _, host = authority.rpartition("@")
            user = auth.split(":", 1)[0]
            authority = f"{user}{':' + SHOWN if ':' in auth else ''}@{host}"
        if "?" in tail:
            path, _, query = tail.partition("?")
            tail = f"{path}?{_redact_query(query)}"
        elif "?" in authority:
            host, _, query = authority.partition("?")
            authority = f"{host}?{_redact_query(query)}"
        return scrub(f"{head}://{authority}{slash}{tail}")
    return scrub(_KEYWORD_VALUE.sub(lambda m: f"{m['key']}={SHOWN}", conninfo))


def _redact_query(query: str) -> str:
    def one(match: re.Match[str]) -> str:
        if unquote(match["name"]).lower() in SECRET_KEYWORDS:
            return f"{match['key']}{SHOWN}"
        return match.group(0)

    return _QUERY_PARAM.sub(one, query)
