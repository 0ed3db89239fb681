"""Writes a results JSON in bench/README.md's shape, one metric a line so a
diff of two runs reads figure by figure (shared by the GPU scripts' Python)."""
import json


def write(path, result, metrics, notes):
    """`result` (without its metrics and notes), then `metrics`, then
    `notes` if any, to `path`; checked to parse back."""
    head = {k: v for k, v in result.items() if k not in ("metrics", "notes")}
    text = json.dumps(head, indent=1)[:-2] + ',\n "metrics": [\n'
    text += ",\n".join("  " + json.dumps(m) for m in metrics) + "\n ]"
    if notes:
        text += ',\n "notes": ' + json.dumps(notes, indent=1).replace("\n", "\n ")
    text += "\n}\n"
    json.loads(text)
    with open(path, "w") as f:
        f.write(text)


def fmt(v):
    """A figure for a table: 4 significant digits, `-` for none."""
    return "-" if v is None else f"{v:.4g}"
