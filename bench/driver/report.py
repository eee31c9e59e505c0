"""The report's environment section (machine, server, settings) and its number format."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from pathlib import Path

from testkit import install

from .run import BUNDLE, Server, run


def environment(server: Server) -> list[str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    ((version,),) = server.sql("postgres", "select version()")
    settings = server.sql(
        "postgres",
        "select name, setting || coalesce(' ' || unit, ''), source from pg_settings"
        " where source not in ('default', 'override', 'client', 'session')"
        "   and name not in ('port', 'unix_socket_directories')"
        " order by name",
    )
    # What createdb installed: the head's one file, or --release's (sql/releases).
    installed = BUNDLE if server.release is None else install.released("pgfence", server.release)
    bundle = hashlib.sha256(installed.read_bytes()).hexdigest()[:16]
    lines = [
        f"- machine: {os.cpu_count()} CPUs (nproc), {mem} memory, CPU model: {cpu}; "
        f"{platform.system()} {platform.release()}",
        f"- server: {version}",
        f"- pgbench: {run([server.pgbench, '--version']).strip()}",
        f"- installed: {installed.relative_to(install.ROOT)} (sha256 {bundle}…)",
        "- settings that are not PostgreSQL's defaults (all from testkit.cluster and initdb; the "
        "benchmark sets nothing else"
        + (f", except {', '.join(f'`{x}`' for x in server.settings)} (its options)"
           if server.settings else "")
        + "): "
        + ", ".join(f"`{n} = {s}`" for n, s, _src in settings),
    ]
    return lines


def fmt(v: float) -> str:
    return f"{v:,.0f}"

