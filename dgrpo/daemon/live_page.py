"""The status server's page at ``/``: a read-only view of the node, its peers and its reward curve, drawn in the
browser from ``/status`` every 2 s (``dgrpo/assets/live/index.html``: inline CSS and vanilla JS, nothing fetched
from elsewhere, no form, no control).

The page is served with a Content-Security-Policy that allows only its own inline script and style (by hash),
fetches to its own origin and ``data:`` images (the empty favicon): were a peer-provided string ever to reach the
DOM as markup, no script of it would run.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "assets" / "live" / "index.html"
_BLOCK = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


@cache
def page_bytes() -> bytes:
    return PAGE.read_bytes()


def _hashes(html: str, tag: str) -> str:
    digests = [hashlib.sha256(body.encode()).digest() for kind, body in _BLOCK.findall(html) if kind == tag]
    return " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests)


@cache
def content_security_policy() -> str:
    html = page_bytes().decode()
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src {_hashes(html, 'script')}",
            f"style-src {_hashes(html, 'style')}",
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )


def page_headers() -> dict[str, str]:
    """The headers the page goes out with, besides its type and length."""
    return {
        "Content-Security-Policy": content_security_policy(),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }
