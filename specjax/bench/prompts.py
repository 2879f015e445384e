"""The prompt suite of `python -m specjax bench`: fixed and versioned.

Any change to a prompt, or a prompt added or removed, bumps VERSION, so that results.json files
from different suites are never compared by mistake. Four categories:

- code-completion: the start of standard-library-like Python, to be continued;
- code-editing: a function, an instruction to change it, and the start of the rewritten
  function, so that most of the answer is a copy of the prompt: where n-gram lookup shines;
- long-code-editing: a whole module (1,400 prompt tokens with SmolLM2's tokenizer; written for
  this suite), an instruction to change it throughout and the start of the rewritten module:
  the use n-gram decoding is made for, where the text to copy is long. Skipped, with a note,
  for models whose context window is too short (the embedded ones have 256 positions);
- prose-chat: English prose and a chat turn (rendered with the target's chat template when it
  has one, as plain text otherwise).

`quick: True` marks the one short prompt per category that `bench --quick` runs (none for
long-code-editing, long by design); the three are 17 to 32 tokens long with the embedded
checkpoints' tokenizer, so that they share one prompt bucket and compile once.
"""

VERSION = 2   # 2: the long-code-editing category

_RENAME_FUNCTION = '''\
def sum_positive(x):
    total_count = 0
    for value in x:
        if value > 0:
            total_count += value
    return total_count
'''

_DOCSTRING_FUNCTION = '''\
def read_config(path, defaults=None):
    result = dict(defaults or {})
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result
'''

_CLASS_TO_EDIT = '''\
class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def peek(self):
        if not self.items:
            raise IndexError("peek from empty stack")
        return self.items[-1]
'''

# A module to rewrite whole, written for this suite. A raw string, so that its own "\n" escapes
# stay as written.
_LEDGER_MODULE = r'''"""A small stock ledger: items, their quantities and prices, and CSV files to keep them in.

    ledger = Ledger.load("stock.csv")
    ledger.receive("bolt-m4", 200)
    ledger.ship("bolt-m4", 40)
    print(ledger.report())
    ledger.save("stock.csv")
"""

import csv
import datetime
from dataclasses import dataclass, field

FIELDS = ("sku", "name", "quantity", "unit_price", "reorder_level")


class LedgerError(ValueError):
    """A request the ledger cannot carry out: an unknown item, or more stock than there is."""


@dataclass
class Item:
    sku: str
    name: str
    quantity: int = 0
    unit_price: float = 0.0
    reorder_level: int = 0
    history: list = field(default_factory=list)

    def value(self):
        return self.quantity * self.unit_price

    def needs_reorder(self):
        return self.quantity <= self.reorder_level

    def record(self, change, reason):
        stamp = datetime.date.today().isoformat()
        self.history.append((stamp, change, reason))


class Ledger:
    def __init__(self, items=None):
        self.items = {}
        for item in items or []:
            self.add(item)

    def __len__(self):
        return len(self.items)

    def __contains__(self, sku):
        return sku in self.items

    def add(self, item):
        if item.sku in self.items:
            raise LedgerError(f"item {item.sku!r} is already in the ledger")
        if item.quantity < 0:
            raise LedgerError(f"item {item.sku!r} has a negative quantity")
        self.items[item.sku] = item

    def get(self, sku):
        try:
            return self.items[sku]
        except KeyError:
            raise LedgerError(f"no item {sku!r} in the ledger") from None

    def receive(self, sku, quantity, reason="delivery"):
        if quantity <= 0:
            raise LedgerError(f"cannot receive {quantity} of {sku!r}")
        item = self.get(sku)
        item.quantity += quantity
        item.record(quantity, reason)
        return item.quantity

    def ship(self, sku, quantity, reason="order"):
        if quantity <= 0:
            raise LedgerError(f"cannot ship {quantity} of {sku!r}")
        item = self.get(sku)
        if quantity > item.quantity:
            raise LedgerError(f"cannot ship {quantity} of {sku!r}: only {item.quantity} in stock")
        item.quantity -= quantity
        item.record(-quantity, reason)
        return item.quantity

    def remove(self, sku):
        item = self.get(sku)
        del self.items[sku]
        return item

    def find(self, text):
        text = text.lower()
        return [item for item in self.items.values()
                if text in item.sku.lower() or text in item.name.lower()]

    def total_value(self):
        return sum(item.value() for item in self.items.values())

    def to_reorder(self):
        return sorted((item for item in self.items.values() if item.needs_reorder()),
                      key=lambda item: item.quantity - item.reorder_level)

    def report(self, width=60):
        lines = ["Stock report".center(width), "=" * width]
        for item in sorted(self.items.values(), key=lambda item: item.sku):
            flag = " (reorder)" if item.needs_reorder() else ""
            lines.append(f"{item.sku:<12} {item.name[:24]:<24} {item.quantity:>6} "
                         f"{item.value():>12.2f}{flag}")
        lines.append("-" * width)
        lines.append(f"{len(self.items)} items, total value {self.total_value():.2f}")
        return "\n".join(lines)

    @classmethod
    def load(cls, path):
        items = []
        with open(path, newline="", encoding="utf-8") as f:
            for number, row in enumerate(csv.DictReader(f), start=2):
                try:
                    items.append(Item(sku=row["sku"], name=row["name"],
                                      quantity=int(row["quantity"]),
                                      unit_price=float(row["unit_price"]),
                                      reorder_level=int(row["reorder_level"] or 0)))
                except (KeyError, ValueError) as e:
                    raise LedgerError(f"{path}, line {number}: {e}") from None
        return cls(items)

    def save(self, path):
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for item in sorted(self.items.values(), key=lambda item: item.sku):
                writer.writerow({name: getattr(item, name) for name in FIELDS})


def merge(first, second):
    """A new ledger with the items of both; quantities of the same item are added up."""
    merged = Ledger()
    for ledger in (first, second):
        for item in ledger.items.values():
            if item.sku in merged:
                merged.get(item.sku).quantity += item.quantity
            else:
                merged.add(Item(item.sku, item.name, item.quantity, item.unit_price,
                                item.reorder_level))
    return merged
'''

_LEDGER_FIRST_LINE = _LEDGER_MODULE.splitlines(keepends=True)[0]

PROMPTS = [
    # -- code completion -------------------------------------------------------------------
    {"id": "complete-read-lines", "category": "code-completion", "quick": True,
     "prompt": "import os\nimport sys\n\n\ndef read_lines(path):\n    lines = []\n"},
    {"id": "complete-fibonacci", "category": "code-completion", "quick": False,
     "prompt": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'},
    {"id": "complete-binary-search", "category": "code-completion", "quick": False,
     "prompt": ('def binary_search(items, target):\n'
                '    """Return the index of target in the sorted list items, or -1."""\n'
                '    lo, hi = 0, len(items) - 1\n'
                '    while lo <= hi:\n')},
    {"id": "complete-parse-args", "category": "code-completion", "quick": False,
     "prompt": ('import os\nimport sys\n\n\n'
                'def main(argv=None):\n'
                '    """Command-line entry point."""\n'
                '    if argv is None:\n'
                '        argv = sys.argv[1:]\n')},
    # -- code editing (the answer mostly copies the prompt) ---------------------------------
    {"id": "edit-rename-short", "category": "code-editing", "quick": True,
     "prompt": "# Rename x to n:\ndef double(x):\n    return x * 2\n\ndef double(n):\n"},
    {"id": "edit-rename", "category": "code-editing", "quick": False,
     "prompt": ("# Rename the parameter `x` to `values` in this function:\n\n" + _RENAME_FUNCTION
                + "\n# After renaming:\n\ndef sum_positive(values):\n")},
    {"id": "edit-docstring", "category": "code-editing", "quick": False,
     "prompt": ("# Add a docstring to this function:\n\n" + _DOCSTRING_FUNCTION
                + "\n# With a docstring:\n\ndef read_config(path, defaults=None):\n"
                  '    """Read KEY=VALUE lines from path into a dict."""\n')},
    {"id": "edit-type-hints", "category": "code-editing", "quick": False,
     "prompt": ("# Add type hints to the methods of this class:\n\n" + _CLASS_TO_EDIT
                + "\n# With type hints:\n\nclass Stack:\n    def __init__(self) -> None:\n")},
    # -- long code editing: a whole module to rewrite -------------------------------------
    {"id": "long-edit-rename-class", "category": "long-code-editing", "quick": False,
     "prompt": ("# Rename the class `Item` to `StockItem` everywhere in this module:\n\n"
                + _LEDGER_MODULE + "\n# The module after renaming:\n\n" + _LEDGER_FIRST_LINE)},
    {"id": "long-edit-type-hints", "category": "long-code-editing", "quick": False,
     "prompt": ("# Add type hints to every function and method of this module:\n\n"
                + _LEDGER_MODULE + "\n# With type hints:\n\n" + _LEDGER_FIRST_LINE)},
    # -- prose and chat ---------------------------------------------------------------------
    {"id": "prose-docstring", "category": "prose-chat", "quick": True,
     "prompt": ('"""Utilities for reading and writing files.\n\n'
                'This module provides functions that')},
    {"id": "prose-comment", "category": "prose-chat", "quick": False,
     "prompt": "# The functions below implement a small cache that keeps the most recently"},
    {"id": "chat-explain", "category": "prose-chat", "quick": False, "chat": True,
     "prompt": "Explain in two sentences what a hash table is."},
]

SUITE = {"version": VERSION, "prompts": PROMPTS}
