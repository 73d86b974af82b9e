"""An independent RFC 8785 (JCS) + execution-id implementation in Python, used
to check the engine's ids.  Written from the RFC, sharing no code with the C
implementation."""
import hashlib
import json
import math
import re


def es_number(x):
    """ECMAScript Number::toString for a double."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        raise ValueError("non-finite numbers are not JSON")
    if x == 0:
        return "0"
    if x < 0:
        return "-" + es_number(-x)
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:e([+-]\d+))?", repr(x))
    ip, fp, exp = m.group(1), m.group(2) or "", int(m.group(3) or 0)
    allds = ip + fp
    lead = len(allds) - len(allds.lstrip("0"))
    n = len(ip) + exp - lead          # value = 0.DIGITS x 10^n
    digits = allds.lstrip("0").rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    mant = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{mant}e{'+' if e >= 0 else '-'}{abs(e)}"


def canonical(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, float)):
        return es_number(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ",".join(canonical(x) for x in v) + "]"
    if isinstance(v, dict):
        keys = sorted(v.keys(), key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(v[k]) for k in keys) + "}"
    raise TypeError(type(v))


def execution_id(ws, wf, vertex, mode, material):
    text = canonical(["idemflow/v1", ws, wf, vertex, mode, material])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
