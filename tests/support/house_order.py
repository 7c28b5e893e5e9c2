"""The order of the rooms in docs/house.yaml: each room stands on a floor and imports only rooms below it, each
arrow (`may_import`) with its reason, and a room's `doors` the only modules of it other rooms may import."""
from __future__ import annotations


def allowed_rooms(room: dict, rules: dict) -> set[str]:
    """The rooms `room` may import: its own, its may_import ("*": every room on a lower floor) and
    everyone_may_import, each only when on a lower floor (order_breaks names an arrow pointing up)."""
    floors = {r["name"]: r["floor"] for r in rules["rooms"]}
    names = set(room["may_import"]) | set(rules["everyone_may_import"])
    names = set(floors) if "*" in names else names
    return {n for n in names if floors.get(n, room["floor"]) < room["floor"]} | {room["name"]}


def order_breaks(rules: dict) -> list[str]:
    """Rules that break the order: a room without a floor, an arrow (may_import) without its reason, to no room, or
    to a room on the same or a higher floor; doors that are not the room's modules; rooms not listed top floor
    first (the map reads from the top down)."""
    floors = {r["name"]: r.get("floor") for r in rules["rooms"]}
    breaks = [f"room {name}: no floor (an integer; ground floor 0)" for name, f in floors.items()
              if type(f) is not int]
    for room in (r for r in rules["rooms"] if type(r.get("floor")) is int):
        if not isinstance(room["may_import"], dict):
            breaks.append(f"room {room['name']}: may_import must map each room to the reason for the arrow")
            continue
        for name, reason in room["may_import"].items():
            if not (isinstance(reason, str) and reason.strip()):
                breaks.append(f"room {room['name']}: may_import {name} has no reason; say why the arrow exists")
            if name == "*":
                continue
            if name not in floors:
                breaks.append(f"room {room['name']}: may_import {name}, which is no room")
            elif type(floors[name]) is int and floors[name] >= room["floor"]:
                breaks.append(f"room {room['name']} (floor {room['floor']}) may import {name} (floor {floors[name]}): "
                              "the arrow points up the order; a room imports only rooms on lower floors")
        for door in room.get("doors") or {}:
            if door not in room["modules"]:
                breaks.append(f"room {room['name']}: door {door} is not one of its modules")
    order = [r["floor"] for r in rules["rooms"] if type(r.get("floor")) is int]
    if order != sorted(order, reverse=True):
        breaks.append("docs/house.yaml: rooms must be listed from the top floor down (the map reads that way)")
    return breaks
