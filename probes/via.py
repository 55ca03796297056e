"""Parse the `Via` header (RFC 9110 §7.6.3): one member per hop, in order.

    Via = #( received-protocol RWS received-by [ RWS comment ] )
    received-protocol = [ protocol-name "/" ] protocol-version

Real-world values are not always conformant (older Kong sends `Via: kong/2.8.1`), so the
parser is lenient: a member with a single word is taken as the `received_by` name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ViaHop:
    protocol: str          # "HTTP/1.1"; "" when the member carries no protocol
    received_by: str       # host[:port] or pseudonym ("varnish", "google", "kong/3.4.2")
    comment: str | None    # text of the trailing (comment), e.g. "CloudFront"


def split_members(value: str) -> list[str]:
    """Split on commas outside parentheses and quotes (comments may contain commas)."""
    out, cur, depth, quoted = [], [], 0, False
    for ch in value:
        if quoted:
            cur.append(ch)
            if ch == '"':
                quoted = False
            continue
        if ch == '"':
            quoted = True
        elif ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return [m for m in out if m]


def _parse_member(member: str) -> ViaHop:
    comment = None
    if "(" in member:
        head, _, tail = member.partition("(")
        comment = tail.rsplit(")", 1)[0].strip() or None
        member = head.strip()
    words = member.split()
    if len(words) == 1:
        return ViaHop("", words[0], comment)
    proto, by = words[0], words[1]
    if "/" in proto:
        name, _, ver = proto.partition("/")
        protocol = f"{name.upper()}/{ver}"
    else:
        protocol = f"HTTP/{proto}"
    return ViaHop(protocol, by, comment)


def parse_via(values: str | list[str]) -> list[ViaHop]:
    """All hops from one or several Via header values, first hop first."""
    if isinstance(values, str):
        values = [values]
    hops: list[ViaHop] = []
    for value in values:
        hops += [_parse_member(m) for m in split_members(value)]
    return hops
