"""`make size`: lines per module and per package, so the code's size stays visible."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    per_package: dict[str, int] = defaultdict(int)
    for path in sorted(ROOT.glob("[ea][np][gp]*/**/*.py")):
        lines = sum(1 for line in path.read_text().splitlines() if line.strip())
        rel = path.relative_to(ROOT)
        per_package[str(rel.parent)] += lines
        print(f"{lines:6d}  {rel}")
    print()
    for package, lines in sorted(per_package.items()):
        print(f"{lines:6d}  {package}/")
    print(f"{sum(per_package.values()):6d}  total")


if __name__ == "__main__":
    main()
