"""The recall loop's bookkeeping (DeepSeekMath §2.1), as pure functions over URLs and scores.

After scoring the pool: keep the pages above the threshold (at most the top N); count pages and
collected pages per domain; a domain with more than ``domain_share`` of its pages collected is a
candidate; within candidates, URL path prefixes are what people approve as math; uncollected pages
under approved prefixes join the seed. The loop stops when an iteration recalls mostly what the
previous one did (the paper stopped when the 4th recalled 98% of the 3rd's pages).
"""

from __future__ import annotations

import heapq
from collections import Counter
from urllib.parse import urlsplit


def domain(url: str) -> str:
    return urlsplit(url).netloc.lower()


def path_prefix(url: str, depth: int) -> str:
    """``domain/first/depth/segments`` of a URL: the unit a person approves (``site.org/math``)."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s][:depth]
    return "/".join([parts.netloc.lower(), *segments])


def under(url: str, prefixes: set[str] | list[str]) -> bool:
    """Is ``url`` under one of the approved prefixes (whole path segments only)?"""
    parts = urlsplit(url)
    full = "/".join([parts.netloc.lower(), *[s for s in parts.path.split("/") if s]])
    return any(full == p or full.startswith(p.rstrip("/") + "/") for p in prefixes)


def select(scored: list[tuple[str, float]], threshold: float, top_n: int | None) -> set[str]:
    """The URLs scored >= ``threshold``, at most the ``top_n`` best (ties broken by URL)."""
    above = [(s, u) for u, s in scored if s >= threshold]
    if top_n is not None and len(above) > top_n:
        above = heapq.nlargest(top_n, above)
    return {u for _, u in above}


def domain_stats(urls: list[str], collected: set[str]) -> dict[str, dict[str, float]]:
    """Per domain: pages in the pool, pages collected, and the collected share."""
    pages = Counter(domain(u) for u in urls)
    got = Counter(domain(u) for u in urls if u in collected)
    return {d: {"pages": n, "collected": got[d], "share": got[d] / n} for d, n in sorted(pages.items())}


def candidate_domains(stats: dict[str, dict[str, float]], share: float) -> list[str]:
    """Domains with more than ``share`` of their pages collected: math-related (paper: 10%)."""
    return [d for d, s in stats.items() if s["share"] > share]


def prefix_stats(urls: list[str], collected: set[str], domains: list[str], depth: int) -> dict[str, dict[str, int]]:
    """Per URL path prefix in the candidate domains: pages, collected, and uncollected pages (what
    approving the prefix would add to the seed)."""
    wanted = set(domains)
    pages, got = Counter(), Counter()
    for u in urls:
        if domain(u) in wanted:
            p = path_prefix(u, depth)
            pages[p] += 1
            got[p] += u in collected
    return {p: {"pages": n, "collected": got[p], "uncollected": n - got[p]} for p, n in sorted(pages.items())}


def recalled_again(previous: set[str], current: set[str]) -> float:
    """Share of this iteration's pages that the previous iteration had already recalled."""
    return len(current & previous) / len(current) if current else 1.0
