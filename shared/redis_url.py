"""Redis URLs: which schemes the client takes, and a form safe to log (the password masked)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit

SCHEMES = ("redis", "rediss", "unix")  # what redis-py's from_url accepts
MASK = "***"
_SECRET_QUERY_KEYS = ("password",)


def check_redis_url(url: str) -> str:
    """The URL when its scheme is one Redis clients take; a ValueError naming the scheme (never the URL, which may
    hold a password) otherwise."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ValueError("is not a URL (expected redis://[[user]:password@]host[:port][/db], rediss://... or "
                         "unix:///path)") from None
    if parts.scheme not in SCHEMES:
        shown = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise ValueError(f"has {shown}; expected one of {', '.join(s + '://' for s in SCHEMES)}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"names no host (expected {parts.scheme}://host[:port][/db])")
    return url


def masked_url(url: str) -> str:
    """The URL with its password (in the netloc or a `password=` query parameter) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        credentials, host = netloc.rsplit("@", 1)
        user = credentials.split(":", 1)[0] if ":" in credentials else ""
        netloc = f"{user}:{MASK}@{host}" if ":" in credentials else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
