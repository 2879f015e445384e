"""The prompt suite of `python -m specjax bench`: fixed and versioned.

Any change to a prompt, or a prompt added or removed, bumps VERSION, so that results.json files
from different suites are never compared by mistake. Three categories:

- code-completion: the start of standard-library-like Python, to be continued;
- code-editing: a function, an instruction to change it, and the start of the rewritten
  function, so that most of the answer is a copy of the prompt: where n-gram lookup shines;
- prose-chat: English prose and a chat turn (rendered with the target's chat template when it
  has one, as plain text otherwise).

`quick: True` marks the one short prompt per category that `bench --quick` runs; the three are
17 to 32 tokens long with the embedded checkpoints' tokenizer, so that they share one prompt
bucket and compile once.
"""

VERSION = 1

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
