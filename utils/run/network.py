"""Which network interface a multi-machine job's gloo groups use (GLOO_SOCKET_IFNAME, set by start_training.sh).

Unset, gloo binds every rank to the address its hostname resolves to: 127.0.1.1 on Debian and Ubuntu, which
no other machine can reach, so the first gloo group (the checkpoint savers', 60-minute timeout) waits an hour
and crashes. The launcher names the interface instead: on machine 0 the one that holds --main-process-ip,
elsewhere the one whose route reaches it; never `lo`. A --main-process-ip that is a name resolving to loopback
here (machine 0's own name in /etc/hosts) is refused: the other machines see another address. A loopback
address written as such (127.0.0.1) means every machine is this host (a test): gloo's default then works.

    python -m utils.run.network HOST     prints the interface (nothing when none is needed or GLOO_SOCKET_IFNAME
                                         is set), or one error line for a HOST no machine can dial
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import sys
from pathlib import Path

from utils.errors import PiconeoxError, cli
from utils.run.allocation import operator_variable

SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's (primary) IPv4 address


def interface_addresses() -> dict[str, str]:
    """{interface: IPv4 address} for every interface that has one, loopback included."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def routed_interface(addr: ipaddress.IPv4Address) -> str | None:
    """The interface of the main table's longest matching IPv4 route to `addr`, or None when unknown."""
    try:
        table = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return None
    best = None  # (prefix bits, interface): the longest matching prefix wins, as in the kernel
    for line in table:
        fields = line.split()
        dest, mask = (int.from_bytes(bytes.fromhex(x), "little") for x in (fields[1], fields[7]))
        if int(addr) & mask == dest and (best is None or mask.bit_count() > best[0]):
            best = (mask.bit_count(), fields[0])
    return best[1] if best else None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def check_main_process_ip(host: str, dns_may_lag: bool = False, variable: str | None = None) -> bool:
    """Refuse, before the launch, a --main-process-ip no machine can dial: one with a port, a dotted quad that
    is no IPv4 address (999.1.1.1), a name that does not resolve here. With `dns_may_lag` (the name came from a
    scheduler's MASTER_ADDR: a Kubernetes service name resolves only once the master pod is up) an unresolved
    name is a warning, and False is returned; True when the name resolves or is an address."""
    flag = f"{variable}={host!r} in the environment" if variable else f"--main-process-ip {host!r}"
    if not host.strip():
        raise PiconeoxError(f"{flag} is empty: give machine 0's address, e.g. 10.0.0.1")
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and not _is_address(host):
        raise PiconeoxError(f"{flag} carries a port: pass --main-process-ip {name.strip('[]')} "
                            f"--main-process-port {port}")
    if _is_address(host):
        if ipaddress.ip_address(host).is_unspecified or ipaddress.ip_address(host).is_multicast:
            raise PiconeoxError(f"{flag} is no machine's address (unspecified or multicast): give machine 0's "
                                "address as the other machines reach it, e.g. 10.0.0.1")
        return True
    if all(part.isdigit() for part in host.split(".")):
        raise PiconeoxError(f"{flag} is not an IPv4 address (four numbers 0-255, e.g. 10.0.0.1)")
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as e:
        if dns_may_lag:
            print(f"warning: MASTER_ADDR {host} does not resolve yet ({getattr(e, 'strerror', None) or e}); "
                  "the launch waits for it as the scheduler's other pods start", file=sys.stderr)
            return False
        raise PiconeoxError(f"{flag} does not resolve on this machine ({getattr(e, 'strerror', None) or e}): "
                            "give machine 0's address (e.g. 10.0.0.1) or a name in DNS or /etc/hosts") from None
    return True


def check_gloo_ifname(value: str | None) -> None:
    """Refuse a GLOO_SOCKET_IFNAME naming an interface this machine lacks (gloo raises in every rank)."""
    if not value:  # unset or empty: gloo's default
        return
    names = {name for _, name in socket.if_nameindex()}
    if missing := [n for n in value.split(",") if n != n.strip() or n not in names]:
        spaces = " (spaces around a name are part of it)" if missing[0] != missing[0].strip() else ""
        raise PiconeoxError(f"GLOO_SOCKET_IFNAME={value!r} names no network interface of this machine "
                            f"({missing[0]!r}{spaces}); it has {', '.join(sorted(names))}: "
                            "set one of those, or unset it (start_training.sh chooses one)")


def gloo_interface(host: str) -> str | None:
    """The interface for GLOO_SOCKET_IFNAME on a job of several machines whose machine 0 is `host`; None when
    every machine is this host (`host` is a loopback address) or when nothing here resolves or routes to it.

    Raises PiconeoxError for a name that resolves to loopback here: the other machines cannot reach that.
    """
    try:
        addr = ipaddress.IPv4Address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return None
    if addr.is_loopback:
        if _is_address(host):
            return None
        others = ", ".join(f"{n} {a}" for n, a in interface_addresses().items() if not a.startswith("127."))
        raise PiconeoxError(f"--main-process-ip {host} resolves to {addr} (loopback) on this machine, which the "
                            "other machines cannot reach: pass machine 0's address as they see it"
                            f"{f' (this machine has {others})' if others else ''}")
    holder = next((n for n, a in interface_addresses().items() if a == str(addr)), None)
    name = holder or routed_interface(addr)
    return None if name == "lo" else name


@cli
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m utils.run.network MAIN_PROCESS_IP", file=sys.stderr)
        return 2
    variable = operator_variable(os.environ)
    from_operator = variable is not None and os.environ[variable] == argv[0]
    if not check_main_process_ip(argv[0], dns_may_lag=from_operator, variable=variable if from_operator else None):
        return 0  # nothing to route to yet: gloo picks the interface once the name resolves
    if os.environ.get("GLOO_SOCKET_IFNAME"):  # the user's choice wins (checked by the preflight)
        return 0
    name = gloo_interface(argv[0])
    if name:
        print(name)
    elif not (_is_address(argv[0]) and ipaddress.ip_address(argv[0]).is_loopback):
        print(f"warning: no network interface routes to --main-process-ip {argv[0]}; set GLOO_SOCKET_IFNAME "
              "yourself", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
