"""What the benchmarks share: their scratch database, the machine they ran on, CPU use, percentiles."""

import os
import platform
import socket
from urllib.parse import urlsplit, urlunsplit


def admin_url(url: str) -> tuple[str, str]:
    """The maintenance database's URL on the same server, and the benchmark database's name."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), parts.path.lstrip("/")


def set_database(url: str, *, create: bool) -> None:
    """Drop the benchmark database (closing its connections), then create it afresh if `create`."""
    import psycopg

    admin, name = admin_url(url)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            connection.execute(f'CREATE DATABASE "{name}"')


def machine() -> str:
    cpu = "?"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as info:
        memory_kib = int(info.readline().split()[1])
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory_kib / 2**20:.0f} GiB memory, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def cpu_busy() -> tuple[float, float]:
    """Busy and total jiffies of all CPUs so far (/proc/stat): two readings give the share used between them."""
    with open("/proc/stat") as stat:
        fields = [float(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
