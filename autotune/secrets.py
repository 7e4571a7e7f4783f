"""Secrets never printed, stored, exported or shipped: a storage URL's password is masked in
every text that could carry it (messages, progress lines, records, reports)."""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
_CREDENTIALS = re.compile(
    r"^(?P<head>[A-Za-z][\w+.-]*://[^:/@]*):(?P<password>.*)@(?P<rest>[^@]*)$", re.DOTALL
)


_QUERY = re.compile(r"(?i)([?&]password=)([^&#]*)")


def password_of(url: str) -> str | None:
    """The password in ``scheme://user:password@host/...`` or in a ``?password=`` query
    (None when it holds none)."""
    match = _CREDENTIALS.match(url)
    if match is not None and match.group("password"):
        return match.group("password")
    query = _QUERY.search(url)
    return query.group(2) if query and query.group(2) else None


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ***; anything else unchanged."""
    match = _CREDENTIALS.match(url)
    if match is not None and match.group("password"):
        url = f"{match.group('head')}:{MASK}@{match.group('rest')}"
    return _QUERY.sub(lambda m: m.group(1) + (MASK if m.group(2) else ""), url)


def redact(text: str, *urls: str | None) -> str:
    """``text`` with the password of each of ``urls`` masked wherever it appears (as written,
    or URL-decoded, as a database driver may echo it)."""
    for url in urls:
        password = password_of(url) if url else None
        if not password:
            continue
        for form in {password, unquote(password)}:
            if len(form) >= 3:  # a one- or two-letter password would mask ordinary words
                text = text.replace(form, MASK)
    return text
